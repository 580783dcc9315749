package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/sdk/plan"
)

// cluster is the starting state most tests share: web has two ports served
// by one slice, db has one port and no endpoints.
type cluster struct {
	web, db *corev1.Service
	webEPs  *discoveryv1.EndpointSlice
}

func newCluster() cluster {
	return cluster{
		web: service("web", "10.96.0.10", svcPort("http", 80), svcPort("metrics", 9090)),
		db:  service("db", "10.96.0.20", svcPort("sql", 5432)),
		webEPs: endpointSlice("web-1", "web", ports(epPort("http", 8080), epPort("metrics", 9100)),
			"10.244.0.11", "10.244.0.12"),
	}
}

// feed delivers the cluster's objects and the end of the initial listing.
func (c cluster) feed(p *proxy.Proxy) {
	h := p.Handler()
	h.OnNode(nil, node("n1"))
	h.OnService(nil, c.web)
	h.OnService(nil, c.db)
	h.OnEndpointSlice(nil, c.webEPs)
	h.OnSynced()
}

const clusterPlan = `node n1 zone=z1 address=192.168.0.10
service default/db:sql/TCP
  clusterIP 10.96.0.20 port 5432
  no endpoints: reject
service default/web:http/TCP
  clusterIP 10.96.0.10 port 80
  endpoint 10.244.0.11:8080 weight=1 node=n1 ready serving local
  endpoint 10.244.0.12:8080 weight=1 node=n1 ready serving local
service default/web:metrics/TCP
  clusterIP 10.96.0.10 port 9090
  endpoint 10.244.0.11:9100 weight=1 node=n1 ready serving local
  endpoint 10.244.0.12:9100 weight=1 node=n1 ready serving local
`

// synced returns a proxy that has fully synced the shared cluster, with
// the backend's calls and the log of that first sync already checked.
func synced(t *testing.T) (*proxy.Proxy, *fakeBackend, *logStore, cluster) {
	t.Helper()
	p, be, logs := newProxy(t)
	c := newCluster()
	c.feed(p)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("first full sync: %v", err)
	}
	if be.count() != 1 {
		t.Fatalf("first full sync: backend called %d times, want once", be.count())
	}
	logs.take()
	return p, be, logs, c
}

func TestFirstSyncIsFull(t *testing.T) {
	p, be, logs := newProxy(t)
	newCluster().feed(p)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync(full): %v", err)
	}
	if n := be.count(); n != 1 {
		t.Fatalf("backend called %d times, want once", n)
	}
	call := be.last(t)
	if !call.full() {
		t.Errorf("full sync passed a partial request with changed=%v", call.changed)
	}
	if got := call.plan.String(); got != clusterPlan {
		t.Errorf("backend got plan:\n%s\nwant:\n%s", got, clusterPlan)
	}
	if got := p.Plan().String(); got != clusterPlan {
		t.Errorf("Plan() after the sync:\n%s\nwant:\n%s", got, clusterPlan)
	}

	records := logs.take()
	syncing := withPrefix(records, "Syncing rules")
	if len(syncing) != 1 || syncing[0].Attrs["full"] != "true" {
		t.Errorf(`want one "Syncing rules" record with full=true; log:%s`, logged(records))
	}
	// A full sync is routine (the periodic resync): it must not log every service.
	for _, msg := range []string{"Adding new service", "Updating endpoints", "Removing service"} {
		if r := withPrefix(records, msg); len(r) > 0 {
			t.Errorf("full sync logged %q per service:%s", msg, logged(r))
		}
	}
	if r := withPrefix(records, "Synced rules"); len(r) != 1 || r[0].Attrs["services"] != "3" {
		t.Errorf(`want one "Synced rules" record with services=3; log:%s`, logged(records))
	}
}

func TestPlanReturnsACopy(t *testing.T) {
	p, _, _, _ := synced(t)
	cp := p.Plan()
	delete(cp.Services, key("db", "sql"))
	cp.Services[key("web", "http")].Endpoints[0].Weight = 7
	if got := p.Plan().String(); got != clusterPlan {
		t.Errorf("editing the result of Plan() changed the proxy's plan:\n%s", got)
	}
}

func TestSliceUpdateSyncsOnlyThatService(t *testing.T) {
	p, be, logs, c := synced(t)
	// Both ports read the slice, so an address change touches both.
	p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.11", "10.244.0.12", "10.244.0.13"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	if n := be.count(); n != 2 {
		t.Fatalf("backend called %d times in all, want 2", n)
	}
	call := be.last(t)
	want := []plan.Key{key("web", "http"), key("web", "metrics")}
	if call.full() || !sameKeys(call.changed, want) {
		t.Errorf("partial sync passed changed=%v, want %v", call.changed, want)
	}
	for _, k := range want {
		if n := len(call.plan.Services[k].Endpoints); n != 3 {
			t.Errorf("%s: backend's plan has %d endpoints, want 3", k, n)
		}
	}
	if db := call.plan.Services[key("db", "sql")]; db == nil {
		t.Errorf("the untouched service db is missing from the plan passed to the backend")
	}

	records := logs.take()
	if r := withPrefix(records, "Syncing rules"); len(r) != 1 || r[0].Attrs["full"] != "false" {
		t.Errorf(`want one "Syncing rules" record with full=false; log:%s`, logged(records))
	}
	updating := withPrefix(records, "Updating endpoints")
	if len(updating) != 2 {
		t.Fatalf(`want two "Updating endpoints" records, one per port; log:%s`, logged(records))
	}
	for _, r := range updating {
		if !strings.HasPrefix(r.Attrs["service"], "default/web:") || r.Attrs["endpoints"] != "3" {
			t.Errorf("unexpected record %s", r)
		}
	}
}

func TestNoOpUpdateDoesNotCallBackend(t *testing.T) {
	tests := []struct {
		name   string
		update func(p *proxy.Proxy, c cluster)
	}{
		{"same slice, new resource version", func(p *proxy.Proxy, c cluster) {
			cur := withAddrs(c.webEPs, "10.244.0.11", "10.244.0.12")
			p.Handler().OnEndpointSlice(c.webEPs, cur)
		}},
		{"slice label the plan ignores", func(p *proxy.Proxy, c cluster) {
			cur := withAddrs(c.webEPs, "10.244.0.11", "10.244.0.12")
			cur.Labels["endpointslice.kubernetes.io/managed-by"] = "someone"
			p.Handler().OnEndpointSlice(c.webEPs, cur)
		}},
		{"same endpoints, other order", func(p *proxy.Proxy, c cluster) {
			p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.12", "10.244.0.11"))
		}},
		{"service annotation", func(p *proxy.Proxy, c cluster) {
			cur := c.web.DeepCopy()
			cur.Annotations = map[string]string{"note": "hello"}
			p.Handler().OnService(c.web, cur)
		}},
		{"slice of a service that does not exist", func(p *proxy.Proxy, c cluster) {
			p.Handler().OnEndpointSlice(nil, endpointSlice("ghost-1", "ghost", ports(epPort("http", 80)), "10.244.0.99"))
		}},
		{"headless service added", func(p *proxy.Proxy, c cluster) {
			p.Handler().OnService(nil, service("headless", corev1.ClusterIPNone, svcPort("http", 80)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, be, logs, c := synced(t)
			tt.update(p, c)
			if err := p.Sync(context.Background(), false); err != nil {
				t.Fatalf("Sync(partial): %v", err)
			}
			if n := be.count(); n != 1 {
				t.Errorf("backend called again (%d calls), want no call: last changed=%v", n, be.last(t).changed)
			}
			if got := p.Plan().String(); got != clusterPlan {
				t.Errorf("plan changed:\n%s", got)
			}
			records := logs.take()
			for _, msg := range []string{"Adding new service", "Updating endpoints", "Removing service", "Failed", "Skipping"} {
				if r := withPrefix(records, msg); len(r) > 0 {
					t.Errorf("no-op update logged:%s", logged(r))
				}
			}
		})
	}
}

func TestDeletedServiceIsRemoved(t *testing.T) {
	p, be, logs, c := synced(t)
	p.Handler().OnService(c.web, nil)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	call := be.last(t)
	gone := []plan.Key{key("web", "http"), key("web", "metrics")}
	if be.count() != 2 || call.full() || !sameKeys(call.changed, gone) {
		t.Fatalf("after deleting web: %d calls, last changed=%v; want a second, partial call with %v",
			be.count(), call.changed, gone)
	}
	for _, k := range gone {
		if _, ok := call.plan.Services[k]; ok {
			t.Errorf("%s: still in the plan passed to the backend", k)
		}
		if _, ok := p.Plan().Services[k]; ok {
			t.Errorf("%s: still in Plan()", k)
		}
	}
	if _, ok := call.plan.Services[key("db", "sql")]; !ok {
		t.Errorf("db vanished with web")
	}
	records := logs.take()
	removing := withPrefix(records, "Removing service")
	if len(removing) != 2 {
		t.Errorf(`want two "Removing service" records; log:%s`, logged(records))
	}
	for _, r := range removing {
		if !strings.HasPrefix(r.Attrs["service"], "default/web:") {
			t.Errorf("unexpected record %s", r)
		}
	}

	// Its slice going away later changes nothing more.
	p.Handler().OnEndpointSlice(c.webEPs, nil)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	if be.count() != 2 {
		t.Errorf("deleting the slice of a deleted service called the backend: changed=%v", be.last(t).changed)
	}
}

func TestServiceBecomingExternalNameIsRemoved(t *testing.T) {
	p, be, _, c := synced(t)
	cur := c.db.DeepCopy()
	cur.Spec.Type = corev1.ServiceTypeExternalName
	cur.Spec.ExternalName = "db.example.com"
	p.Handler().OnService(c.db, cur)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	call := be.last(t)
	if want := []plan.Key{key("db", "sql")}; !sameKeys(call.changed, want) {
		t.Errorf("changed=%v, want %v", call.changed, want)
	}
	if _, ok := call.plan.Services[key("db", "sql")]; ok {
		t.Errorf("an ExternalName service is still planned")
	}
}

func TestAddedServiceIsLogged(t *testing.T) {
	p, be, logs, _ := synced(t)
	h := p.Handler()
	h.OnService(nil, service("api", "10.96.0.30", svcPort("grpc", 443)))
	h.OnEndpointSlice(nil, endpointSlice("api-1", "api", ports(epPort("grpc", 8443)), "10.244.0.21"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	call := be.last(t)
	if want := []plan.Key{key("api", "grpc")}; !sameKeys(call.changed, want) {
		t.Errorf("changed=%v, want %v", call.changed, want)
	}
	records := logs.take()
	adding := withPrefix(records, "Adding new service")
	if len(adding) != 1 || adding[0].Attrs["service"] != "default/api:grpc/TCP" || adding[0].Attrs["endpoints"] != "1" {
		t.Errorf(`want one "Adding new service" record for default/api:grpc/TCP with 1 endpoint; log:%s`, logged(records))
	}
}

func TestMultiPortChangesOnlyWhatChanged(t *testing.T) {
	// api has two ports. In "split" its endpoints come in one slice per
	// port, as the EndpointSlice controller makes when pods expose
	// different ports; in "shared" one slice carries both ports.
	split := func() []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{
			endpointSlice("api-http", "api", ports(epPort("http", 8080)), "10.244.0.11", "10.244.0.12"),
			endpointSlice("api-admin", "api", ports(epPort("admin", 9000)), "10.244.0.11"),
		}
	}
	shared := func() []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{
			endpointSlice("api-1", "api", ports(epPort("http", 8080), epPort("admin", 9000)), "10.244.0.11", "10.244.0.12"),
		}
	}
	tests := []struct {
		name   string
		slices func() []*discoveryv1.EndpointSlice
		// change returns the updated version of one of the slices.
		change func(old []*discoveryv1.EndpointSlice) (prev, cur *discoveryv1.EndpointSlice)
		want   []plan.Key
	}{
		{
			name:   "split: admin slice gains an endpoint",
			slices: split,
			change: func(old []*discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice) {
				return old[1], withAddrs(old[1], "10.244.0.11", "10.244.0.12")
			},
			want: []plan.Key{key("api", "admin")},
		},
		{
			name:   "split: http slice loses an endpoint",
			slices: split,
			change: func(old []*discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice) {
				return old[0], withAddrs(old[0], "10.244.0.12")
			},
			want: []plan.Key{key("api", "http")},
		},
		{
			name:   "shared: admin target port moves",
			slices: shared,
			change: func(old []*discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice) {
				cur := old[0].DeepCopy()
				cur.ResourceVersion = bump(cur.ResourceVersion)
				cur.Ports = ports(epPort("http", 8080), epPort("admin", 9001))
				return old[0], cur
			},
			want: []plan.Key{key("api", "admin")},
		},
		{
			name:   "shared: an endpoint goes away, so both ports change",
			slices: shared,
			change: func(old []*discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice) {
				return old[0], withAddrs(old[0], "10.244.0.11")
			},
			want: []plan.Key{key("api", "admin"), key("api", "http")},
		},
		{
			name:   "shared: an endpoint stops being ready, so both ports change",
			slices: shared,
			change: func(old []*discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice) {
				cur := withAddrs(old[0], "10.244.0.11", "10.244.0.12")
				cur.Endpoints[1].Conditions.Ready = new(false)
				return old[0], cur
			},
			want: []plan.Key{key("api", "admin"), key("api", "http")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, be, logs := newProxy(t)
			h := p.Handler()
			h.OnService(nil, service("api", "10.96.0.30", svcPort("http", 80), svcPort("admin", 9000)))
			h.OnService(nil, service("other", "10.96.0.31", svcPort("http", 80)))
			old := tt.slices()
			for _, s := range old {
				h.OnEndpointSlice(nil, s)
			}
			h.OnSynced()
			if err := p.Sync(context.Background(), true); err != nil {
				t.Fatalf("Sync(full): %v", err)
			}
			before := p.Plan()
			logs.take()

			h.OnEndpointSlice(tt.change(old))
			if err := p.Sync(context.Background(), false); err != nil {
				t.Fatalf("Sync(partial): %v", err)
			}
			if be.count() != 2 {
				t.Fatalf("backend called %d times, want a full and a partial sync", be.count())
			}
			call := be.last(t)
			if call.full() || !sameKeys(call.changed, tt.want) {
				t.Errorf("changed=%v, want %v", call.changed, tt.want)
			}
			// Whatever was not reported must really be unchanged.
			for k, s := range call.plan.Services {
				if !slices.Contains(tt.want, k) && !s.Equal(before.Services[k]) {
					t.Errorf("%s changed but was not reported:\nbefore %safter  %s", k, before.Services[k], s)
				}
			}
			if r := withPrefix(logs.take(), "Updating endpoints"); len(r) != len(tt.want) {
				t.Errorf(`want %d "Updating endpoints" records, got:%s`, len(tt.want), logged(r))
			}
		})
	}
}

func TestPortRenameRemovesOldKeyAndAddsNew(t *testing.T) {
	p, be, logs, c := synced(t)
	cur := c.db.DeepCopy()
	cur.Spec.Ports[0].Name = "postgres"
	p.Handler().OnService(c.db, cur)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	call := be.last(t)
	if want := []plan.Key{key("db", "sql"), key("db", "postgres")}; !sameKeys(call.changed, want) {
		t.Errorf("changed=%v, want %v", call.changed, want)
	}
	if _, ok := call.plan.Services[key("db", "sql")]; ok {
		t.Errorf("the old port key is still planned")
	}
	records := logs.take()
	if len(withPrefix(records, "Adding new service")) != 1 || len(withPrefix(records, "Removing service")) != 1 {
		t.Errorf("want one added and one removed service; log:%s", logged(records))
	}
}

func TestBackendFailure(t *testing.T) {
	p, be, logs, c := synced(t)
	boom := errors.New("netlink: boom")
	be.failNextSync(boom)
	p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.13"))

	err := p.Sync(context.Background(), false)
	if !errors.Is(err, boom) {
		t.Fatalf("Sync: got error %v, want %v", err, boom)
	}
	records := logs.take()
	failed := withPrefix(records, "Failed to execute")
	if len(failed) != 1 {
		t.Fatalf(`want one record starting "Failed to execute"; log:%s`, logged(records))
	}
	if failed[0].Level != slog.LevelError || !strings.Contains(failed[0].Attrs["error"], "boom") {
		t.Errorf("failure record %s: want level ERROR and the backend's error", failed[0])
	}
	if !strings.Contains(failed[0].Attrs["services"], key("web", "http").String()) {
		t.Errorf("failure record %s: want the services the commit carried", failed[0])
	}
	if r := withPrefix(records, "Synced rules"); len(r) > 0 {
		t.Errorf("a failed sync logged success:%s", logged(r))
	}

	// The final plan is what the kernel holds: the failed change is not in
	// it, the planner's plan has it.
	for _, k := range []plan.Key{key("web", "http"), key("web", "metrics")} {
		if eps := p.Plan().Services[k].Endpoints; len(eps) != 2 {
			t.Errorf("%s: final plan after the failure has %v, want the two committed endpoints", k, eps)
		}
		eps := p.Planned().Services[k].Endpoints
		if len(eps) != 1 || eps[0].Address.String() != "10.244.0.13" {
			t.Errorf("%s: planner's plan after the failure has %v, want only 10.244.0.13", k, eps)
		}
	}

	// A following full sync commits it.
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("full sync after the failure: %v", err)
	}
	call := be.last(t)
	if !call.full() {
		t.Errorf("full sync passed changed=%v", call.changed)
	}
	if eps := call.plan.Services[key("web", "http")].Endpoints; len(eps) != 1 || eps[0].Address.String() != "10.244.0.13" {
		t.Errorf("full sync after the failure committed %v, want only 10.244.0.13", eps)
	}
}

func TestSyncAfterFailureIsFull(t *testing.T) {
	// The keys a failed partial sync carried are pending nowhere else, so
	// a partial sync after it must not pass only the newer changes.
	p, be, _, c := synced(t)
	be.failNextSync(errors.New("boom"))
	p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.13"))
	if err := p.Sync(context.Background(), false); err == nil {
		t.Fatal("Sync: want the backend's error")
	}
	// Nothing new: the retry must still reach the backend, and in full.
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if n := be.count(); n != 3 {
		t.Fatalf("backend called %d times, want 3 (full, failed partial, retry)", n)
	}
	if call := be.last(t); !call.full() {
		t.Errorf("retry after a failure passed changed=%v, want a full sync", call.changed)
	}
	// Once it succeeded, partial syncs are partial again.
	p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.14"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	if call := be.last(t); call.full() {
		t.Errorf("partial sync after a successful retry was full")
	}
}

func TestInvalidInputIsSkipped(t *testing.T) {
	p, be, logs := newProxy(t)
	h := p.Handler()
	h.OnService(nil, service("bad", "10.96.0.300", svcPort("http", 80)))
	h.OnEndpointSlice(nil, endpointSlice("bad-1", "bad", ports(epPort("http", 8080)), "10.244.0.11"))
	h.OnService(nil, service("good", "10.96.0.10", svcPort("http", 80)))
	h.OnEndpointSlice(nil, endpointSlice("good-1", "good", ports(epPort("http", 8080)), "10.244.0.11"))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync(full): %v", err)
	}
	records := logs.take()
	skipped := withPrefix(records, "Skipping invalid input")
	if len(skipped) != 1 {
		t.Fatalf(`want exactly one "Skipping invalid input" record; log:%s`, logged(records))
	}
	r := skipped[0]
	if r.Level != slog.LevelWarn || r.Attrs["object"] != "Service default/bad" || r.Attrs["field"] != "spec.clusterIP" ||
		!strings.Contains(r.Attrs["reason"], "10.96.0.300") {
		t.Errorf("record %s: want a warning naming Service default/bad, spec.clusterIP and the value", r)
	}
	call := be.last(t)
	if want := []plan.Key{key("good", "http")}; !sameKeys(call.plan.Keys(), want) {
		t.Errorf("backend got services %v, want %v", call.plan.Keys(), want)
	}
	if got := p.Problems("default/bad"); len(got) != 1 || !strings.Contains(got[0], "spec.clusterIP") {
		t.Errorf("Problems(default/bad) = %q, want the clusterIP problem (weir diagnose reports it)", got)
	}
	if got := p.Problems("default/good"); len(got) != 0 {
		t.Errorf("Problems(default/good) = %q, want none", got)
	}

	// The good service keeps syncing; the bad one is not re-reported
	// while nothing touches it.
	good := endpointSlice("good-1", "good", ports(epPort("http", 8080)), "10.244.0.11")
	h.OnEndpointSlice(good, withAddrs(good, "10.244.0.12"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatalf("Sync(partial): %v", err)
	}
	if want := []plan.Key{key("good", "http")}; !sameKeys(be.last(t).changed, want) {
		t.Errorf("changed=%v, want %v", be.last(t).changed, want)
	}
	if r := withPrefix(logs.take(), "Skipping invalid input"); len(r) > 0 {
		t.Errorf("partial sync of the good service re-reported:%s", logged(r))
	}

	// A periodic full sync replans the bad service too, but the problem is
	// the same one, so it is not logged again.
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync(full): %v", err)
	}
	if r := withPrefix(logs.take(), "Skipping invalid input"); len(r) > 0 {
		t.Errorf("periodic full sync re-reported an unchanged problem:%s", logged(r))
	}
}

func TestInvalidEndpointReportedOncePerSlice(t *testing.T) {
	// One bad address in a slice both ports read is one problem, not two;
	// the slice's other endpoints still count.
	p, be, logs := newProxy(t)
	h := p.Handler()
	h.OnService(nil, service("web", "10.96.0.10", svcPort("http", 80), svcPort("metrics", 9090)))
	h.OnEndpointSlice(nil, endpointSlice("web-1", "web", ports(epPort("http", 8080), epPort("metrics", 9100)),
		"10.244.0.11", "not-an-ip"))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync(full): %v", err)
	}
	records := logs.take()
	skipped := withPrefix(records, "Skipping invalid input")
	if len(skipped) != 1 {
		t.Fatalf(`want one "Skipping invalid input" record; log:%s`, logged(records))
	}
	if r := skipped[0]; r.Attrs["object"] != "EndpointSlice default/web-1" || r.Attrs["field"] != "endpoints[1].addresses[0]" {
		t.Errorf("record %s: want EndpointSlice default/web-1, endpoints[1].addresses[0]", r)
	}
	for _, k := range []plan.Key{key("web", "http"), key("web", "metrics")} {
		if eps := be.last(t).plan.Services[k].Endpoints; len(eps) != 1 {
			t.Errorf("%s: %d endpoints, want the one good one", k, len(eps))
		}
	}
}

func TestSyncWithoutBackendPlansOnly(t *testing.T) {
	p := proxy.New(proxy.Options{NodeName: "n1", Log: slog.New(slog.DiscardHandler)})
	newCluster().feed(p)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if got := p.Plan().String(); got != clusterPlan {
		t.Errorf("plan:\n%s\nwant:\n%s", got, clusterPlan)
	}
}

// TestZoneChangeReplansTopology moves the node to another zone: services
// whose endpoints carry zone hints are replanned and only they reach the
// backend.
func TestZoneChangeReplansTopology(t *testing.T) {
	p, be, _ := newProxy(t)
	h := p.Handler()
	n := node("n1")
	h.OnNode(nil, n)
	h.OnService(nil, service("zonal", "10.96.0.30", svcPort("http", 80)))
	slice := endpointSlice("zonal-1", "zonal", ports(epPort("http", 8080)), "10.244.0.31", "10.244.1.31")
	slice.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}
	slice.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z2"}}}
	h.OnEndpointSlice(nil, slice)
	h.OnService(nil, service("plain", "10.96.0.31", svcPort("http", 80)))
	h.OnEndpointSlice(nil, endpointSlice("plain-1", "plain", ports(epPort("http", 8080)), "10.244.0.32"))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	forCluster := func() []string {
		var out []string
		for _, e := range p.Plan().Services[key("zonal", "http")].Endpoints {
			if e.ForCluster {
				out = append(out, e.Address.String())
			}
		}
		return out
	}
	if got := forCluster(); len(got) != 1 || got[0] != "10.244.0.31" {
		t.Fatalf("in zone z1, cluster traffic goes to %v, want [10.244.0.31]", got)
	}

	moved := n.DeepCopy()
	moved.Labels[corev1.LabelTopologyZone] = "z2"
	h.OnNode(n, moved)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if want := []plan.Key{key("zonal", "http")}; !sameKeys(be.last(t).changed, want) {
		t.Errorf("after the zone change the backend got %v, want %v", be.last(t).changed, want)
	}
	if got := forCluster(); len(got) != 1 || got[0] != "10.244.1.31" {
		t.Errorf("in zone z2, cluster traffic goes to %v, want [10.244.1.31]", got)
	}
}

// recordingHealth keeps the last set of health checks it was given.
type recordingHealth struct{ last []health.Service }

func (r *recordingHealth) Sync(s []health.Service) error { r.last = slices.Clone(s); return nil }

// TestHealthChecksFollowLocalEndpoints checks that an externalTrafficPolicy
// Local load balancer's health check counts this node's endpoints, once
// across ports, and goes away with the service.
func TestHealthChecksFollowLocalEndpoints(t *testing.T) {
	hc := &recordingHealth{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: newFakeBackend(), HealthChecks: hc})
	h := p.Handler()
	lb := service("lb", "10.96.0.40", svcPort("http", 80), svcPort("https", 443))
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = 32000
	lb.Spec.Ports[0].NodePort, lb.Spec.Ports[1].NodePort = 30080, 30443
	h.OnService(nil, lb)
	slice := endpointSlice("lb-1", "lb", ports(epPort("http", 8080), epPort("https", 8443)), "10.244.0.41", "10.244.0.42", "10.244.1.43")
	slice.Endpoints[2].NodeName = new("n2")
	h.OnEndpointSlice(nil, slice)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	want := []health.Service{{Namespace: ns, Name: "lb", Port: 32000, LocalEndpoints: 2}}
	if !slices.Equal(hc.last, want) {
		t.Errorf("health checks %v, want %v", hc.last, want)
	}
	h.OnService(lb, nil)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(hc.last) != 0 {
		t.Errorf("after deleting the service, health checks %v, want none", hc.last)
	}
}

// TestHealthCheckCountsReadyEndpointsOnly shows that, like kube-proxy, a
// health check counts only ready local endpoints: a node whose local
// endpoints are all terminating answers 503, so load balancers drain it,
// while those endpoints still serve its Local traffic.
func TestHealthCheckCountsReadyEndpointsOnly(t *testing.T) {
	hc := &recordingHealth{}
	be := newFakeBackend()
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, HealthChecks: hc})
	h := p.Handler()
	lb := service("lb", "10.96.0.40", svcPort("http", 80))
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = 32000
	lb.Spec.Ports[0].NodePort = 30080
	h.OnService(nil, lb)
	slice := endpointSlice("lb-1", "lb", ports(epPort("http", 8080)), "10.244.0.41", "10.244.0.42")
	for i := range slice.Endpoints {
		slice.Endpoints[i].Conditions = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true), Terminating: new(true)}
	}
	h.OnEndpointSlice(nil, slice)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if want := []health.Service{{Namespace: ns, Name: "lb", Port: 32000}}; !slices.Equal(hc.last, want) {
		t.Errorf("health checks %v, want %v", hc.last, want)
	}
	local := 0
	for _, s := range be.last(t).plan.Services {
		for _, e := range s.Endpoints {
			if e.ForLocal {
				local++
			}
		}
	}
	if local != 2 {
		t.Errorf("%d endpoints serve Local traffic, want the 2 terminating ones as a fallback", local)
	}
}

// TestNodeOnlyChangeReachesBackend changes only the node's podCIDRs: the
// backend is called with no changed services and the new node.
func TestNodeOnlyChangeReachesBackend(t *testing.T) {
	p, be, _ := newProxy(t)
	h := p.Handler()
	n := node("n1")
	h.OnNode(nil, n)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	calls := be.count()
	withCIDR := n.DeepCopy()
	withCIDR.Spec.PodCIDRs = []string{"10.244.3.0/24"}
	h.OnNode(n, withCIDR)
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if be.count() != calls+1 {
		t.Fatalf("backend called %d times after the podCIDR change, want once", be.count()-calls)
	}
	last := be.last(t)
	if last.full() || len(last.changed) != 0 || len(last.plan.Node.PodCIDRs) != 1 {
		t.Errorf("got changed=%v (full %v) node %v; want a partial sync with no services and the new podCIDR",
			last.changed, last.full(), last.plan.Node)
	}
}

// recordingConntrack keeps the flows it was asked to clear and the
// destinations of the last reconciliation; each reconciliation reports
// deleting deleted.
type recordingConntrack struct {
	flows      []conntrack.Flow
	serving    []conntrack.Serving
	reconciled int
	deleted    conntrack.Deleted
}

func (r *recordingConntrack) Clear(_ context.Context, f []conntrack.Flow) (int, error) {
	r.flows = append(r.flows, f...)
	return len(f), nil
}

func (r *recordingConntrack) Reconcile(_ context.Context, s []conntrack.Serving) (conntrack.Deleted, error) {
	r.serving, r.reconciled = s, r.reconciled+1
	return r.deleted, nil
}

// servingAt returns the serving endpoints the last reconciliation gave dest.
func (r *recordingConntrack) servingAt(dest string) []netip.Addr {
	for _, s := range r.serving {
		if s.Dest == netip.MustParseAddrPort(dest) {
			return s.Endpoints
		}
	}
	return nil
}

// TestFirstSyncReconcilesFlows starts a proxy over a UDP service with
// endpoints, as a restart does: its first sync must not clear the
// service's flows (every flow to it was, as if the service had just got
// its first endpoint, breaking DNS at each restart) but reconcile them,
// sparing those of serving endpoints; so does each full sync.
func TestFirstSyncReconcilesFlows(t *testing.T) {
	ct := &recordingConntrack{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: newFakeBackend(), Conntrack: ct})
	h := p.Handler()
	h.OnService(nil, service("dns", "10.96.0.53", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}))
	udp := corev1.ProtocolUDP
	h.OnEndpointSlice(nil, endpointSlice("dns-1", "dns", ports(discoveryv1.EndpointPort{Name: new("dns"), Port: new(int32(53)), Protocol: &udp}),
		"10.244.0.53", "10.244.1.53"))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if len(ct.flows) != 0 {
		t.Errorf("the first sync cleared %v", ct.flows)
	}
	want := []netip.Addr{netip.MustParseAddr("10.244.0.53"), netip.MustParseAddr("10.244.1.53")}
	if got := ct.servingAt("10.96.0.53:53"); ct.reconciled != 1 || !slices.Equal(got, want) {
		t.Errorf("reconciled %d times, serving %v; want once with %v", ct.reconciled, got, want)
	}
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if ct.reconciled != 2 || len(ct.flows) != 0 {
		t.Errorf("after a periodic full sync: reconciled %d times, cleared %v; want twice, nothing", ct.reconciled, ct.flows)
	}
}

// TestStaleUDPFlowsClearedAfterCommit removes an endpoint of a UDP service:
// after the commit, the flows DNATed to it are cleared.
func TestStaleUDPFlowsClearedAfterCommit(t *testing.T) {
	ct := &recordingConntrack{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: newFakeBackend(), Conntrack: ct})
	h := p.Handler()
	dnsPort := corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}
	h.OnService(nil, service("dns", "10.96.0.53", dnsPort))
	udp := corev1.ProtocolUDP
	slice := endpointSlice("dns-1", "dns", ports(discoveryv1.EndpointPort{Name: new("dns"), Port: new(int32(53)), Protocol: &udp}),
		"10.244.0.53", "10.244.1.53")
	h.OnEndpointSlice(nil, slice)
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	ct.flows = nil
	h.OnEndpointSlice(slice, withAddrs(slice, "10.244.0.53"))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	want := conntrack.Flow{Protocol: plan.UDP, Dest: netip.MustParseAddrPort("10.96.0.53:53"), Endpoint: netip.MustParseAddr("10.244.1.53")}
	if !slices.Contains(ct.flows, want) {
		t.Errorf("cleared %v, want it to include %v", ct.flows, want)
	}
}

// TestOnlyOwnNode delivers several Nodes, as a files source folder may
// hold: only the one named NodeName is this node, whichever comes last,
// and deleting another leaves it in place. Without it, the end of the
// listing warns.
func TestOnlyOwnNode(t *testing.T) {
	p, be, logs := newProxy(t)
	h := p.Handler()
	other := node("n2")
	other.Labels[corev1.LabelTopologyZone] = "z2"
	h.OnNode(nil, node("n1"))
	h.OnNode(nil, other)
	h.OnNode(other, nil)
	h.OnService(nil, service("web", "10.96.0.10", svcPort("http", 80)))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if n := be.last(t).plan.Node; n.Name != "n1" || n.Zone != "z1" {
		t.Errorf("the plan's node is %q in zone %q, want n1 in z1", n.Name, n.Zone)
	}
	if w := withPrefix(logs.take(), "The source has no Node"); len(w) != 0 {
		t.Errorf("warned about a missing Node that is there:%s", logged(w))
	}

	p, _, logs = newProxy(t)
	h = p.Handler()
	h.OnNode(nil, other)
	h.OnSynced()
	w := withPrefix(logs.take(), "The source has no Node named nodeName")
	if len(w) != 1 || w[0].Level != slog.LevelWarn || w[0].Attrs["nodeName"] != "n1" {
		t.Errorf("without its own Node: %d warnings naming it, want one:%s", len(w), logged(w))
	}
}
