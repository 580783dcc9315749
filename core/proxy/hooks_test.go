package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/sdk/plan"
)

// fakeHooks drains one endpoint address from every service, withholds the
// services named in closed (as a closed plugin without last good rules
// does), and records what it was asked.
type fakeHooks struct {
	mu      sync.Mutex
	drain   netip.Addr
	closed  map[string]bool // key strings
	fail    error
	applied [][]plan.Key
	fulls   []bool
	forgot  []plan.Key
}

func (h *fakeHooks) Apply(_ context.Context, node plan.Node, in []*plan.Service, full bool) ([]*plan.Service, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var keys []plan.Key
	out := make([]*plan.Service, len(in))
	for i, s := range in {
		keys = append(keys, s.Key)
		if h.closed[s.Key.String()] {
			continue
		}
		out[i] = s
		if j := slices.IndexFunc(s.Endpoints, func(e plan.Endpoint) bool { return e.Address == h.drain }); j >= 0 {
			c := s.Clone()
			c.Endpoints = slices.Delete(c.Endpoints, j, j+1)
			out[i] = c
		}
	}
	h.applied = append(h.applied, keys)
	h.fulls = append(h.fulls, full)
	return out, h.fail
}

func (h *fakeHooks) Forget(keys ...plan.Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forgot = append(h.forgot, keys...)
}

func (h *fakeHooks) last() ([]plan.Key, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applied[len(h.applied)-1], h.fulls[len(h.fulls)-1]
}

func hookedProxy(t *testing.T, h *fakeHooks) (*proxy.Proxy, *fakeBackend, *logStore, cluster) {
	t.Helper()
	be := newFakeBackend()
	logs := &logStore{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, Hooks: h, Log: slog.New(&recordHandler{store: logs})})
	c := newCluster()
	c.feed(p)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	return p, be, logs, c
}

func TestHooksShapeWhatTheBackendGets(t *testing.T) {
	h := &fakeHooks{drain: netip.MustParseAddr("10.244.0.12"), closed: map[string]bool{"default/db:sql/TCP": true}}
	p, be, _, _ := hookedProxy(t, h)
	got := be.last(t).plan
	if _, ok := got.Services[key("db", "sql")]; ok {
		t.Error("a service the hooks withheld reached the backend")
	}
	for _, k := range []plan.Key{key("web", "http"), key("web", "metrics")} {
		for _, e := range got.Services[k].Endpoints {
			if e.Address == h.drain {
				t.Errorf("%s: the backend got the endpoint the hooks dropped", k)
			}
		}
	}
	if _, full := h.last(); !full {
		t.Error("the first sync's hooks call was not full")
	}
	if s := p.Planned().Services[key("web", "http")]; len(s.Endpoints) != 2 {
		t.Errorf("Planned() has %d endpoints for web:http, want the planner's 2", len(s.Endpoints))
	}
	if s := p.Plan().Services[key("web", "http")]; len(s.Endpoints) != 1 {
		t.Errorf("Plan() has %d endpoints for web:http, want 1 after the hooks", len(s.Endpoints))
	}
}

func TestHooksSeeOnlyChangedServices(t *testing.T) {
	h := &fakeHooks{}
	p, be, _, c := hookedProxy(t, h)
	p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.11", "10.244.0.13"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	keys, full := h.last()
	if full || !slices.Equal(keys, []plan.Key{key("web", "http"), key("web", "metrics")}) {
		t.Errorf("hooks got %v (full %v), want the two web ports, partial", keys, full)
	}
	if got := be.last(t).changed; len(got) != 2 {
		t.Errorf("backend changed = %v, want the two web ports", got)
	}

	p.Handler().OnService(c.db, nil)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.forgot, []plan.Key{key("db", "sql")}) {
		t.Errorf("hooks forgot %v, want the removed db port", h.forgot)
	}
}

// An annotation change goes to the hooks (a plugin may read it) but not to
// the backend when the rules stay the same.
func TestHooksGetAnnotationChangesTheBackendDoesNot(t *testing.T) {
	h := &fakeHooks{}
	p, be, _, c := hookedProxy(t, h)
	calls := len(h.applied)
	cur := c.web.DeepCopy()
	cur.Annotations = map[string]string{"canary.weir.dev/split": "web-canary=10"}
	p.Handler().OnService(c.web, cur)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(h.applied) != calls+1 {
		t.Fatalf("hooks called %d times, want once more", len(h.applied)-calls)
	}
	if n := be.count(); n != 1 {
		t.Errorf("backend called %d times, want only the first sync", n)
	}
}

func TestHookFailuresDoNotStopTheSync(t *testing.T) {
	h := &fakeHooks{fail: errors.New(`plugin "drain": call timed out after 100ms`)}
	_, be, _, _ := hookedProxy(t, h)
	if be.count() != 1 {
		t.Fatalf("backend called %d times, want once", be.count())
	}
}

func TestRequestFullSync(t *testing.T) {
	h := &fakeHooks{}
	p, be, _, _ := hookedProxy(t, h)
	p.RequestFullSync() // before Run: no trigger yet, only the flag
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if _, full := h.last(); !full {
		t.Error("the sync after RequestFullSync did not run the hooks over every service")
	}
	if c := be.last(t); !c.full() {
		t.Errorf("the sync after RequestFullSync passed changed=%v to the backend, want a full sync", c.changed)
	}
}

// Touched keys reach the hooks at the next sync with their unchanged
// planned services; the backend gets only those whose rules then changed,
// and nothing at all when none did.
func TestTouchRunsHooksAgain(t *testing.T) {
	h := &fakeHooks{}
	p, be, _, _ := hookedProxy(t, h)
	commits := be.count()
	p.Touch(key("web", "http"), key("gone", "x"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if keys, full := h.last(); full || !slices.Equal(keys, []plan.Key{key("web", "http")}) {
		t.Errorf("hooks got %v (full %v), want web:http alone, partial (a key not in the plan is dropped)", keys, full)
	}
	if n := be.count(); n != commits {
		t.Errorf("the backend got %d syncs for an unchanged output, want none", n-commits)
	}

	h.mu.Lock()
	h.drain = netip.MustParseAddr("10.244.0.12")
	h.mu.Unlock()
	p.Touch(key("web", "http"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if got := be.last(t).changed; !slices.Equal(got, []plan.Key{key("web", "http")}) {
		t.Errorf("backend changed = %v, want web:http", got)
	}
	calls := len(h.applied)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(h.applied) != calls {
		t.Error("a touched key stayed touched after its sync")
	}
}
