package proxy_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/weirproxy/weir/core/proxy"
)

// TestPeriodicFullSyncPlansNothingAgain: a full sync with nothing changed
// hands the backend the whole plan but plans no service again (the planner
// is pure: the plan already holds what it would plan). Planning a service
// allocates a dozen objects; the full sync itself about one per service
// (the health checks' name of each).
func TestPeriodicFullSyncPlansNothingAgain(t *testing.T) {
	p, be, _ := newProxy(t)
	h := p.Handler()
	const n = 1000
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		h.OnService(nil, service(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), svcPort("http", 80)))
		h.OnEndpointSlice(nil, endpointSlice(name+"-1", name, ports(epPort("http", 8080)),
			fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)))
	}
	h.OnSynced()
	ctx := context.Background()
	if err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	first := p.Plan()
	if len(first.Services) != n {
		t.Fatalf("%d services planned, want %d", len(first.Services), n)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if err := p.Sync(ctx, true); err != nil {
			t.Fatal(err)
		}
	})
	// The fake backend copies the plan it is given (a few allocations per
	// service): count the proxy's share by subtracting a copy's.
	copies := testing.AllocsPerRun(5, func() { _ = p.Plan() })
	if proxyAllocs := allocs - copies; proxyAllocs > 2*n {
		t.Errorf("a full sync with nothing changed allocates %.0f times (%.0f without the fake backend's copy) for %d services",
			allocs, proxyAllocs, n)
	}
	if last := be.last(t); !last.full() || len(last.plan.Services) != n {
		t.Errorf("the full sync handed the backend %d services (full %v), want all %d", len(last.plan.Services), last.full(), n)
	}
}

// TestBigSyncReleasesMemory: a committed sync that changed a thousand
// services or more gives the freed memory back (Options.ReleaseMemory,
// called before Sync returns); a sync of one change does not.
func TestBigSyncReleasesMemory(t *testing.T) {
	released := make(chan struct{}, 10)
	be := newFakeBackend()
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, ReleaseMemory: func() { released <- struct{}{} }})
	h := p.Handler()
	const n = 1000
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		h.OnService(nil, service(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), svcPort("http", 80)))
	}
	h.OnSynced()
	ctx := context.Background()
	if err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	default:
		t.Fatal("a sync of 1000 changed services released no memory")
	}
	h.OnService(nil, service("one-more", "10.97.0.1", svcPort("http", 80)))
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, true); err != nil { // a quiet full sync changes nothing
		t.Fatal(err)
	}
	select {
	case <-released:
		t.Error("a sync of one change, or a quiet full sync, released memory")
	default:
	}
}
