package backends

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

func TestNodeIP(t *testing.T) {
	n := plan.Node{Addresses: []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("::ffff:172.30.0.1")}}
	if got := NodeIP(n, false); got != netip.MustParseAddr("172.30.0.1") {
		t.Errorf("IPv4: got %s", got)
	}
	if got := NodeIP(n, true); got != netip.MustParseAddr("fd00::1") {
		t.Errorf("IPv6: got %s", got)
	}
	// kube-proxy assumes loopback when the Node has no address of the family.
	if got := NodeIP(plan.Node{}, false); got != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("no IPv4 address: got %s", got)
	}
	if got := NodeIP(plan.Node{}, true); got != netip.IPv6Loopback() {
		t.Errorf("no IPv6 address: got %s", got)
	}
}

func TestNodeSources(t *testing.T) {
	svc := &plan.Service{
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.5"), netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("198.51.100.6")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("::ffff:172.30.0.0/120")},
	}
	cases := []struct{ node, want string }{
		{"172.30.0.1", "[198.51.100.5/32 198.51.100.6/32]"}, // the mapped range holds the node
		{"10.244.0.1", "[198.51.100.5/32 198.51.100.6/32]"},
		{"172.30.1.1", "[]"},
		{"2001:db8::1", "[]"}, // no IPv6 range
	}
	for _, c := range cases {
		if got := fmt.Sprint(NodeSources(svc, netip.MustParseAddr(c.node))); got != c.want {
			t.Errorf("node %s: got %s, want %s", c.node, got, c.want)
		}
	}
	svc.SourceRanges = append(svc.SourceRanges, netip.MustParsePrefix("2001:db8::/64"))
	if got := fmt.Sprint(NodeSources(svc, netip.MustParseAddr("2001:db8::1"))); got != "[2001:db8::5/128]" {
		t.Errorf("IPv6 node in an IPv6 range: got %s", got)
	}
}

// TestExpectAllowsTheNode checks that a load-balancer IP whose ranges
// hold the node's IP also accepts its own address as a source.
func TestExpectAllowsTheNode(t *testing.T) {
	p := viewPlan()
	lb := Destination{DestExternal, netip.MustParseAddr("192.0.2.10"), plan.TCP, 80}
	for node, want := range map[string]string{"172.30.0.1": "198.51.100.0/24", "198.51.100.9": "192.0.2.10/32 198.51.100.0/24"} {
		p.Node.Addresses = []netip.Addr{netip.MustParseAddr(node)}
		v, _ := Expect(p, ExpectOptions{})
		if got := formatRanges(v.Destinations[lb].Allowed); got != want {
			t.Errorf("node %s: got %s, want %s", node, got, want)
		}
	}
}
