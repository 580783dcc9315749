package main

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
)

// The daemon's read-only debug endpoint, served on the metrics server's
// address for weir diagnose: nothing on it changes state.
const (
	debugStatusPath   = "/debug/weir/status"
	debugServicesPath = "/debug/weir/services"
	debugServicePath  = "/debug/weir/service"
)

// pluginStatus is what the daemon remembers of one hook plugin.
type pluginStatus struct {
	Calls       int       `json:"calls"`
	Failures    int       `json:"failures"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	Quarantined bool      `json:"quarantined"`
}

// debugStatus is the answer of debugStatusPath.
type debugStatus struct {
	Mode string `json:"mode"`
	Node string `json:"node"`
	// PlanNode and ServiceCIDRs are the plan's node and service CIDRs:
	// what a backend's view of one service's rules depends on besides it.
	PlanNode     plan.Node               `json:"planNode"`
	ServiceCIDRs []netip.Prefix          `json:"serviceCIDRs"`
	Sync         proxy.SyncStatus        `json:"sync"`
	Plugins      map[string]pluginStatus `json:"plugins"`
}

// serviceDetail is what the daemon holds of one Service, and what each
// hook plugin changed of its ports: the answer of debugServicePath, and
// of debugServicesPath with ?detail=true for every Service.
type serviceDetail struct {
	Name string `json:"name"`
	proxy.ServiceView
	Changes []diagnose.PluginChange `json:"changes,omitempty"`
}

// debugServer serves the debug endpoint; the proxy, and the chain when
// plugins are configured, are set once they exist.
type debugServer struct {
	mode, node string
	proxy      atomic.Pointer[proxy.Proxy]
	chain      atomic.Pointer[hooks.Chain]
	mu         sync.Mutex
	plugins    map[string]*pluginStatus
}

// detail returns what the daemon holds of the Service name.
func (d *debugServer) detail(p *proxy.Proxy, name string) serviceDetail {
	v := serviceDetail{Name: name, ServiceView: p.Service(name)}
	if c := d.chain.Load(); c != nil {
		for _, s := range v.Planned {
			for _, ch := range c.Changes(s) {
				v.Changes = append(v.Changes, diagnose.PluginChange{Plugin: ch.Plugin, Before: ch.Before, After: ch.After})
			}
		}
	}
	return v
}

func newDebugServer(mode, node string) *debugServer {
	return &debugServer{mode: mode, node: node, plugins: map[string]*pluginStatus{}}
}

// pluginCalled records one plugin call.
func (d *debugServer) pluginCalled(plugin string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.plugin(plugin)
	st.Calls++
	if err != nil {
		st.Failures++
		st.LastError, st.LastErrorAt = err.Error(), time.Now()
	}
}

// pluginQuarantined records a plugin entering or leaving quarantine.
func (d *debugServer) pluginQuarantined(plugin string, quarantined bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.plugin(plugin).Quarantined = quarantined
}

func (d *debugServer) plugin(name string) *pluginStatus {
	st := d.plugins[name]
	if st == nil {
		st = &pluginStatus{}
		d.plugins[name] = st
	}
	return st
}

// handler adds the debug endpoint's paths in front of next.
func (d *debugServer) handler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.HandleFunc("GET "+debugStatusPath, func(w http.ResponseWriter, _ *http.Request) {
		p := d.proxy.Load()
		if p == nil {
			http.Error(w, "weir is starting", http.StatusServiceUnavailable)
			return
		}
		st := debugStatus{Mode: d.mode, Node: d.node, Sync: p.SyncStatus(), Plugins: map[string]pluginStatus{}}
		st.PlanNode, st.ServiceCIDRs = p.Context()
		d.mu.Lock()
		for name, ps := range d.plugins {
			st.Plugins[name] = *ps
		}
		d.mu.Unlock()
		writeJSON(w, st)
	})
	mux.HandleFunc("GET "+debugServicesPath, func(w http.ResponseWriter, r *http.Request) {
		p := d.proxy.Load()
		switch {
		case p == nil:
			http.Error(w, "weir is starting", http.StatusServiceUnavailable)
		case r.URL.Query().Get("detail") == "true":
			var all []serviceDetail
			for _, name := range p.ServiceNames() {
				all = append(all, d.detail(p, name))
			}
			writeJSON(w, all)
		default:
			writeJSON(w, p.ServiceNames())
		}
	})
	mux.HandleFunc("GET "+debugServicePath, func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		p := d.proxy.Load()
		switch {
		case name == "":
			http.Error(w, "want ?name=NAMESPACE/NAME", http.StatusBadRequest)
		case p == nil:
			http.Error(w, "weir is starting", http.StatusServiceUnavailable)
		default:
			writeJSON(w, d.detail(p, name))
		}
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = json.NewEncoder(w).Encode(v)
}
