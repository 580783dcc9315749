package nftables

import (
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelQuietFullSync checks the generation stamp: a periodic full sync
// with nothing changed anywhere commits nothing, one with a changed plan
// commits that change alone, and any other process's commit, or an hour
// since the last refill, makes it refill everything again.
func TestKernelQuietFullSync(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1), podEP(podB, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())
	gen := func() uint32 {
		t.Helper()
		g, err := b.generation()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	before := gen()
	mustSync(t, b, p, backends.FullSync())
	if after := gen(); after != before {
		t.Fatalf("a full sync with nothing changed committed (generation %d -> %d)", before, after)
	}

	moved := web.Clone()
	moved.Endpoints = []plan.Endpoint{podEP(podC, 1)}
	p.Services[web.Key] = moved
	mustSync(t, b, p, backends.FullSync())
	if after := gen(); after != before+1 {
		t.Errorf("a full sync of one changed service committed %d times, want once", after-before)
	}
	addr := netip.AddrPortFrom(vip, 80)
	netns.WantPods(t, "after the changed plan", netns.DialMany(t, topo.Client, addr, 10), "pod-c")

	// Another process's change anywhere: the next full sync refills, which
	// repairs what it did to Weir's table.
	runNft(t, topo.Node, "delete element ip weir service-ips { 10.96.0.10 . tcp . 80 }", "add table ip unrelated")
	mustSync(t, b, p, backends.FullSync())
	netns.WantPods(t, "after a foreign change", netns.DialMany(t, topo.Client, addr, 10), "pod-c")

	// Another process's change, then a partial sync of Weir's own: the
	// generation after that commit vouches for nothing, so the next full
	// sync still refills and repairs.
	runNft(t, topo.Node, "delete element ip weir service-ips { 10.96.0.10 . tcp . 80 }")
	other := svc("default", "other", "http", plan.TCP, "10.96.0.11", 80, 0, podEP(podA, 1))
	p.Services[other.Key] = other
	mustSync(t, b, p, backends.PartialSync(other.Key))
	mustSync(t, b, p, backends.FullSync())
	netns.WantPods(t, "after a foreign change and a partial sync", netns.DialMany(t, topo.Client, addr, 10), "pod-c")

	// An hour after the last refill, a full sync refills even when the
	// generation vouches for the tables.
	before = gen()
	b.refilled = time.Now().Add(-2 * refillEvery)
	mustSync(t, b, p, backends.FullSync())
	if after := gen(); after != before+1 {
		t.Errorf("the hourly refill committed %d times, want once", after-before)
	}
}
