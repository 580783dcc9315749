package conntrack

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// TestCountFlows makes flows to a VIP reach pods a and b, then takes b out
// of the serving endpoints: Count sees a's flow by endpoint and b's as
// stale, deletes nothing, and counts nothing for another destination.
func TestCountFlows(t *testing.T) {
	topo, vip, other := cluster(t)
	r := newRules(t, topo.Node)
	toA, toB := netip.AddrPortFrom(podA, podPort), netip.AddrPortFrom(podB, podPort)
	r.set(t, r.nat, dnat(vip, toA))
	viaA := client(t, topo, 40061, vip)
	wantPod(t, viaA, "a", "VIP to a")
	r.set(t, r.nat, dnat(vip, toB))
	viaB := client(t, topo, 40062, vip)
	wantPod(t, viaB, "b", "VIP to b")

	c := newCleaner(t, topo.Node)
	serving := []Serving{
		{Protocol: plan.UDP, Dest: vip, Endpoints: []netip.Addr{podA}},
		{Protocol: plan.UDP, Dest: other, Endpoints: []netip.Addr{podA}},
	}
	before := len(entries(t, topo.Node))
	counts, err := c.Count(testCtx(t), serving)
	if err != nil {
		t.Fatal(err)
	}
	got := counts[0]
	if got.ByEndpoint[podA] != 1 || got.Stale != 1 || !slices.Equal(got.StaleFrom, []netip.Addr{podB}) || got.Total() != 2 {
		t.Errorf("Count(VIP) = %+v; want one flow to a and one stale flow from b", got)
	}
	if counts[1].Total() != 0 {
		t.Errorf("Count(other VIP) = %+v; want nothing", counts[1])
	}
	if after := len(entries(t, topo.Node)); after != before {
		t.Errorf("Count changed the table: %d entries before, %d after", before, after)
	}
	wantPod(t, viaB, "b", "after Count")
}

func TestDestinationsOfEveryProtocol(t *testing.T) {
	s := &plan.Service{Key: plan.Key{Namespace: "default", Name: "web", Protocol: plan.TCP}, Port: 80, NodePort: 30080,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Endpoints:  []plan.Endpoint{{Address: podA, Serving: true}, {Address: podB}}}
	got := DestinationsOf(s)
	if len(got) != 2 || got[0].Dest != netip.MustParseAddrPort("10.96.0.10:80") || got[1].Dest != netip.AddrPortFrom(netip.Addr{}, 30080) ||
		!slices.Equal(got[0].Endpoints, []netip.Addr{podA}) {
		t.Errorf("DestinationsOf(TCP service) = %+v; want the cluster IP and the node port, with the serving endpoint a", got)
	}
}
