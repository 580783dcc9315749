package health

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// ProxyOptions configures [NewProxy].
type ProxyOptions struct {
	// Timeout is how long a queued change may wait for a successful sync
	// before the proxy is unhealthy; kube-proxy uses twice its sync period.
	Timeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Observe, when set, is told the path and status code of every probe
	// /healthz and /livez answer (for kubeproxy_proxy_healthz_total).
	Observe func(path string, code int)
}

// Proxy tracks whether the proxy keeps the kernel's rules up to date and
// whether this Node should receive traffic, and answers /healthz and
// /livez from that.
//
// The proxy is healthy unless a change has been queued for longer than the
// timeout without a successful sync since (a failed commit counts as one),
// or its source cannot read its objects. It is safe for concurrent use.
type Proxy struct {
	timeout time.Duration
	now     func() time.Time
	observe func(path string, code int)

	mu sync.Mutex
	// lastUpdated is the time of the last successful sync.
	lastUpdated time.Time
	// queued is when the oldest change still waiting for a sync was
	// queued; zero when none waits.
	queued time.Time
	// ineligible is set while this Node is being deleted.
	ineligible bool
	// sourceDown is set while the source cannot read its objects.
	sourceDown bool
}

// NewProxy returns a healthy proxy state with nothing queued.
func NewProxy(opts ProxyOptions) *Proxy {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Proxy{timeout: opts.Timeout, now: opts.Now, observe: opts.Observe}
}

// Queued records that a change waits for a sync; only the oldest waiting
// change counts.
func (h *Proxy) Queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.queued.IsZero() {
		h.queued = h.now()
	}
}

// Updated records a successful sync: every change queued before it is done.
func (h *Proxy) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queued = time.Time{}
	h.lastUpdated = h.now()
}

// SetNodeEligible records whether this Node should receive traffic: false
// while it is being deleted or drained by the cluster autoscaler.
func (h *Proxy) SetNodeEligible(eligible bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ineligible = !eligible
}

// SetSourceAvailable records whether the source can read its objects. While
// it cannot (a manifests folder removed), the rules it delivered last stay
// in force but the proxy is unhealthy: they may no longer be what the
// cluster wants.
func (h *Proxy) SetSourceAvailable(available bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sourceDown = !available
}

// Status is one reading of the proxy's health.
type Status struct {
	// Healthy is false when a change has waited longer than the timeout,
	// or while the source cannot read its objects.
	Healthy bool
	// NodeEligible is false while this Node is being deleted.
	NodeEligible bool
	// LastUpdated is the last successful sync; zero before the first.
	LastUpdated time.Time
	// Now is when the status was read.
	Now time.Time
}

// Status reads the proxy's health now.
func (h *Proxy) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	late := !h.queued.IsZero() && now.Sub(h.queued) >= h.timeout
	return Status{Healthy: !late && !h.sourceDown, NodeEligible: !h.ineligible, LastUpdated: h.lastUpdated, Now: now}
}

// Healthy reports whether the proxy keeps its rules up to date, whatever
// the Node's state; the health-check node ports use it.
func (h *Proxy) Healthy() bool { return h.Status().Healthy }

// Handler returns the handler of /healthz and /livez; every other path is
// 404.
//
// /healthz answers 200 when the proxy is healthy and the Node eligible,
// 503 otherwise; /livez ignores the Node. Both write kube-proxy's JSON
// body.
func (h *Proxy) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { h.serve(w, "/healthz", true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { h.serve(w, "/livez", false) })
	return mux
}

func (h *Proxy) serve(w http.ResponseWriter, path string, withNode bool) {
	st := h.Status()
	healthy := st.Healthy && (st.NodeEligible || !withNode)
	code := http.StatusServiceUnavailable
	lastUpdated := st.LastUpdated
	if healthy {
		// Like kube-proxy, a healthy answer reports a recent update: its
		// older releases reported every sync loop, changes or not.
		code, lastUpdated = http.StatusOK, st.Now
	}
	body := renderStatus(lastUpdated, st.Now, st.NodeEligible, withNode)
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
	if h.observe != nil {
		h.observe(path, code)
	}
}

// renderStatus writes kube-proxy's /healthz body (with nodeEligible) or
// /livez body (without), times in Go's default layout.
func renderStatus(lastUpdated, now time.Time, eligible, withNode bool) []byte {
	b := fmt.Appendf(nil, `{"lastUpdated": %q,"currentTime": %q`, lastUpdated.Round(0).String(), now.Round(0).String())
	if withNode {
		b = fmt.Appendf(b, `, "nodeEligible": %v`, eligible)
	}
	return append(b, '}')
}
