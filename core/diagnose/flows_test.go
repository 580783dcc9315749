package diagnose

import (
	"net/netip"
	"testing"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

// TestFlowFindingsActive: for TCP the finding shows, per endpoint, how
// many tracked connections are open, summed over the port's destinations;
// for UDP, where every entry is active, it does not.
func TestFlowFindingsActive(t *testing.T) {
	a, b := netip.MustParseAddr("10.244.0.11"), netip.MustParseAddr("10.244.0.12")
	counts := []conntrack.FlowCount{
		{Protocol: plan.TCP, ByEndpoint: map[netip.Addr]int{a: 4, b: 2}, Active: map[netip.Addr]int{a: 2}},
		{Protocol: plan.TCP, ByEndpoint: map[netip.Addr]int{a: 1}, Active: map[netip.Addr]int{a: 1}},
	}
	got := flowFindings("default/web:http/TCP", plan.TCP, counts)
	want := "7 tracked flows to its addresses: 10.244.0.11 5 (3 active), 10.244.0.12 2 (0 active)"
	if len(got) != 1 || got[0].Code != "conntrack.flows" || got[0].Message != want {
		t.Errorf("TCP flows: %+v; want one conntrack.flows finding %q", got, want)
	}
	counts = []conntrack.FlowCount{{Protocol: plan.UDP, ByEndpoint: map[netip.Addr]int{a: 2}, Active: map[netip.Addr]int{a: 2}}}
	got = flowFindings("default/dns:dns/UDP", plan.UDP, counts)
	if want := "2 tracked flows to its addresses: 10.244.0.11 2"; len(got) != 1 || got[0].Message != want {
		t.Errorf("UDP flows: %+v; want %q", got, want)
	}
}
