package nftables

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// TestNodeIPRewritesOnlyRangedServices checks that a new node IP reaches
// the services whose load-balancer IPs have source ranges, and only those:
// a partial sync stays O(changes).
func TestNodeIPRewritesOnlyRangedServices(t *testing.T) {
	b, _ := fakeBackend(t, Options{})
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 0, ep("10.244.0.11", 8080, 1))
	web.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	open := svc("default", "open", "http", plan.TCP, "10.96.0.11", 80, 0, ep("10.244.0.12", 8080, 1))
	open.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.6")}
	p := testPlan(web, open, svc("default", "plain", "", plan.UDP, "10.96.0.12", 53, 0))
	p.Node.Addresses = []netip.Addr{netip.MustParseAddr("172.30.0.1")}
	if err := b.Sync(context.Background(), p, backends.FullSync()); err != nil {
		t.Fatal(err)
	}
	tb := b.tables[0]
	if got := slices.Collect(maps.Keys(tb.state.ranged)); !slices.Equal(got, []plan.Key{web.Key}) {
		t.Fatalf("ranged services: got %v, want only web", got)
	}
	if txn, _ := tb.partialTxn(p, nil, nil); !txn.empty() {
		t.Errorf("the same node IP again: the partial transaction is not empty")
	}

	p.Node.Addresses = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	txn, c := tb.partialTxn(p, nil, nil)
	if got := slices.Collect(maps.Keys(c.services)); !slices.Equal(got, []plan.Key{web.Key}) {
		t.Errorf("a node IP inside web's ranges: changed %v, want only web", got)
	}
	if txn.empty() {
		t.Error("a node IP inside web's ranges wrote nothing")
	}

	// Outside every range again, elsewhere: nothing to write, but the new
	// node IP is remembered, so later partial syncs compare with it.
	p.Node.Addresses = []netip.Addr{netip.MustParseAddr("172.30.0.2")}
	if err := b.Sync(context.Background(), p, backends.PartialSync()); err != nil {
		t.Fatal(err)
	}
	p.Node.Addresses = []netip.Addr{netip.MustParseAddr("172.30.0.3")}
	if err := b.Sync(context.Background(), p, backends.PartialSync()); err != nil {
		t.Fatal(err)
	}
	if got := tb.state.nodeIP; got != netip.MustParseAddr("172.30.0.3") {
		t.Errorf("the committed node IP is %s, want 172.30.0.3", got)
	}
}
