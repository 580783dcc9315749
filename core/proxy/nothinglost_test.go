package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

// TestFailedCommitKeepsItsWork fails the commit of an endpoint removal:
// the flows it makes stale, the final plan and the health checks are not
// taken as done, and the retry clears the flows once the kernel accepted
// the change.
func TestFailedCommitKeepsItsWork(t *testing.T) {
	ct := &recordingConntrack{}
	hc := &recordingHealth{}
	be := newFakeBackend()
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, Conntrack: ct, HealthChecks: hc})
	h := p.Handler()
	dns := service("dns", "10.96.0.53", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053})
	dns.Spec.Type = corev1.ServiceTypeLoadBalancer
	dns.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	dns.Spec.HealthCheckNodePort = 32053
	udp := corev1.ProtocolUDP
	slice := endpointSlice("dns-1", "dns", ports(discoveryv1.EndpointPort{Name: new("dns"), Port: new(int32(53)), Protocol: &udp}),
		"10.244.0.53", "10.244.0.54")
	h.OnService(nil, dns)
	h.OnEndpointSlice(nil, slice)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	ct.flows = nil
	dnsKey := plan.Key{Namespace: ns, Name: "dns", Port: "dns", Protocol: plan.UDP}

	be.failNextSync(errors.New("netlink receive: no such file or directory"))
	h.OnEndpointSlice(slice, withAddrs(slice, "10.244.0.53"))
	if err := p.Sync(context.Background(), false); err == nil {
		t.Fatal("Sync: want the backend's error")
	}
	if len(ct.flows) != 0 {
		t.Errorf("flows cleared before the kernel accepted the change: %v", ct.flows)
	}
	if n := len(p.Plan().Services[dnsKey].Endpoints); n != 2 {
		t.Errorf("final plan after the failure has %d endpoints, want the 2 the kernel holds", n)
	}
	if want := []health.Service{{Namespace: ns, Name: "dns", Port: 32053, LocalEndpoints: 2}}; !slices.Equal(hc.last, want) {
		t.Errorf("health checks after the failure %v, want the committed %v", hc.last, want)
	}

	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("retry: %v", err)
	}
	// The retry is a full sync: it reconciles, and 10.244.0.54 serves no
	// more, so its flows go.
	if got, want := ct.servingAt("10.96.0.53:53"), []netip.Addr{netip.MustParseAddr("10.244.0.53")}; !slices.Equal(got, want) {
		t.Errorf("the retry reconciled 10.96.0.53:53 with serving endpoints %v, want %v", got, want)
	}
	if want := []health.Service{{Namespace: ns, Name: "dns", Port: 32053, LocalEndpoints: 1}}; !slices.Equal(hc.last, want) {
		t.Errorf("health checks after the retry %v, want %v", hc.last, want)
	}
}

// TestFailedCommitShowsInHealth: a commit that fails with no change queued
// (the kernel's rules were removed behind Weir's back) makes /healthz fail
// once it has gone on for the timeout.
func TestFailedCommitShowsInHealth(t *testing.T) {
	o := newObserved(t)
	newCluster().feed(o.p)
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	o.be.failNextSync(errors.New("netlink receive: no such file or directory"))
	if err := o.p.Sync(t.Context(), true); err == nil {
		t.Fatal("want the periodic sync to fail")
	}
	o.clock.advance(healthTimeout)
	if o.health.Healthy() {
		t.Error("healthy after failing to commit for the timeout")
	}
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if !o.health.Healthy() {
		t.Error("unhealthy after a successful retry")
	}
}

func created(s *corev1.Service, at time.Time) *corev1.Service {
	s.CreationTimestamp = metav1.NewTime(at)
	return s
}

// TestConflictingNodePortsOlderWins: two services claim one node port. The
// older keeps it, the newer is programmed without it, one warning names
// both, and the newer gets the port once the older lets it go.
func TestConflictingNodePortsOlderWins(t *testing.T) {
	p, be, logs := newProxy(t)
	h := p.Handler()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	np := func(name, ip string, at time.Time) *corev1.Service {
		s := created(service(name, ip, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}), at)
		s.Spec.Type = corev1.ServiceTypeNodePort
		return s
	}
	older, newer := np("zeta", "10.96.0.1", t0), np("alpha", "10.96.0.2", t0.Add(time.Minute))
	h.OnService(nil, older)
	h.OnService(nil, newer)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	got := be.last(t).plan
	if got.Services[key("zeta", "http")].NodePort != 30080 || got.Services[key("alpha", "http")].NodePort != 0 {
		t.Fatalf("node ports zeta %d alpha %d; want 30080 for the older zeta only",
			got.Services[key("zeta", "http")].NodePort, got.Services[key("alpha", "http")].NodePort)
	}
	if len(got.Services[key("alpha", "http")].ClusterIPs) != 1 {
		t.Error("the newer service lost its cluster IP too")
	}
	warned := withPrefix(logs.take(), "Skipping conflicting destination")
	if len(warned) != 1 || !strings.Contains(warned[0].Attrs["reason"], "default/zeta") || warned[0].Attrs["service"] != key("alpha", "http").String() {
		t.Fatalf("want one warning naming both services; got%s", logged(warned))
	}
	// A periodic full sync says nothing new.
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if w := withPrefix(logs.take(), "Skipping conflicting"); len(w) != 0 {
		t.Errorf("the conflict was reported again:%s", logged(w))
	}
	// The older one goes: the newer is replanned in the same partial sync.
	h.OnService(older, nil)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	call := be.last(t)
	if !sameKeys(call.changed, []plan.Key{key("zeta", "http"), key("alpha", "http")}) {
		t.Errorf("changed %v, want both services", call.changed)
	}
	if np := call.plan.Services[key("alpha", "http")].NodePort; np != 30080 {
		t.Errorf("after the older service left, alpha has node port %d, want 30080", np)
	}
}

// TestConflictingClusterIPs: two services with one cluster IP and port, both
// with endpoints; a third service is untouched. The newer one loses the
// address, not its other port.
func TestConflictingClusterIPs(t *testing.T) {
	p, be, _ := newProxy(t)
	h := p.Handler()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.OnService(nil, created(service("old", "10.96.0.10", svcPort("http", 80)), t0))
	h.OnService(nil, created(service("new", "10.96.0.10", svcPort("http", 80), svcPort("admin", 81)), t0.Add(time.Hour)))
	h.OnService(nil, created(service("other", "10.96.0.11", svcPort("http", 80)), t0.Add(time.Hour)))
	for _, name := range []string{"old", "new", "other"} {
		h.OnEndpointSlice(nil, endpointSlice(name+"-1", name, ports(epPort("http", 8080), epPort("admin", 8081)), "10.244.0.11"))
	}
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	got := be.last(t).plan
	for k, want := range map[plan.Key]int{key("old", "http"): 1, key("new", "http"): 0, key("new", "admin"): 1, key("other", "http"): 1} {
		if n := len(got.Services[k].ClusterIPs); n != want {
			t.Errorf("%s has %d cluster IPs, want %d", k, n, want)
		}
	}
}

// readingBackend is a fake backend that can be read back, holding view.
type readingBackend struct {
	*fakeBackend
	view  *backends.View
	reads int
}

func (b *readingBackend) ReadBack(context.Context) (*backends.View, error) {
	b.reads++
	return b.view, nil
}

func (b *readingBackend) Expected(p *plan.Plan) (*backends.View, map[backends.Destination]plan.Key) {
	return backends.Expect(p, backends.ExpectOptions{NodePortFamilies: []int{4}})
}

// TestClosedFailureAfterRestartKeepsTheKernelsRules restarts Weir (a new
// proxy) with a closed plugin failing on db: its rules in the kernel are
// adopted, not wiped, with the weights the kernel has; a service the kernel
// has nothing for stays without rules.
func TestClosedFailureAfterRestartKeepsTheKernelsRules(t *testing.T) {
	dbDest := backends.Destination{Kind: backends.DestCluster, Addr: netip.MustParseAddr("10.96.0.20"), Protocol: plan.TCP, Port: 5432}
	view := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{
		dbDest: {Verdict: backends.VerdictForward, Endpoints: map[netip.AddrPort]uint32{netip.MustParseAddrPort("10.244.0.21:5432"): 3}},
	}}
	be := &readingBackend{fakeBackend: newFakeBackend(), view: view}
	hooks := &fakeHooks{closed: map[string]bool{"default/db:sql/TCP": true, "default/web:metrics/TCP": true}}
	logs := &logStore{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, Hooks: hooks, Log: slog.New(&recordHandler{store: logs})})
	c := newCluster()
	h := p.Handler()
	h.OnEndpointSlice(nil, endpointSlice("db-1", "db", ports(epPort("sql", 5432)), "10.244.0.21", "10.244.0.22"))
	c.feed(p)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	got := be.last(t).plan
	db := got.Services[key("db", "sql")]
	if db == nil {
		t.Fatalf("db, which the kernel serves, was wiped by the first sync; log:%s", logged(logs.take()))
	}
	weights := map[string]uint32{}
	for _, e := range db.Endpoints {
		weights[e.Address.String()] = e.Weight
	}
	if weights["10.244.0.21"] != 3 || weights["10.244.0.22"] != 0 {
		t.Errorf("adopted db weights %v, want the kernel's: .21 weight 3, .22 drained", weights)
	}
	if _, ok := got.Services[key("web", "metrics")]; ok {
		t.Error("web:metrics, which the kernel had no rules for, got rules though its closed plugin failed")
	}
	if got.Services[key("web", "http")] == nil {
		t.Error("web:http, which no plugin failed on, is missing")
	}
	if be.reads != 1 {
		t.Errorf("kernel read back %d times, want once", be.reads)
	}
	// The plugin keeps failing: the adopted rules stay, without reading again.
	h.OnEndpointSlice(nil, endpointSlice("db-2", "db", ports(epPort("sql", 5432)), "10.244.0.23"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if be.reads != 1 || !p.Plan().Services[key("db", "sql")].Equal(db) {
		t.Errorf("after a change, reads %d and db %v; want the adopted rules kept, no second read", be.reads, p.Plan().Services[key("db", "sql")])
	}
}

// TestNodePortRange passes the range to the planner: a node port outside
// it is not programmed.
func TestNodePortRange(t *testing.T) {
	be := newFakeBackend()
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, NodePorts: planner.PortRange{First: 30000, Last: 32767}})
	s := service("ssh", "10.96.0.22", corev1.ServicePort{Name: "ssh", Port: 22, Protocol: corev1.ProtocolTCP, NodePort: 22})
	s.Spec.Type = corev1.ServiceTypeNodePort
	p.Handler().OnService(nil, s)
	p.Handler().OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if np := be.last(t).plan.Services[key("ssh", "ssh")].NodePort; np != 0 {
		t.Errorf("node port %d outside nodePortRange was programmed", np)
	}
}

// TestSourceDownIsUnhealthy: a source that cannot read its objects makes
// the proxy unhealthy until it can again, and leaves the rules alone.
func TestSourceDownIsUnhealthy(t *testing.T) {
	o := newObserved(t)
	newCluster().feed(o.p)
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	r, ok := o.p.Handler().(source.Reporter)
	if !ok {
		t.Fatal("the proxy's handler is not a source.Reporter")
	}
	calls := o.be.count()
	r.OnSourceDown(errors.New(`files source: source.path "/etc/weir/manifests" is gone`))
	if o.health.Healthy() {
		t.Error("healthy while the source is down")
	}
	if err := o.p.Sync(t.Context(), false); err != nil || o.be.count() != calls {
		t.Errorf("a sync while the source is down called the backend (%d calls, error %v)", o.be.count()-calls, err)
	}
	r.OnSourceUp()
	if !o.health.Healthy() {
		t.Error("unhealthy after the source came back")
	}
}
