//go:build vm

package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelSourceRangesFromTheNode checks, in both flavours, the node's
// own connections to a load-balancer IP with source ranges: they leave
// from that IP (it is on Weir's interface) and are dropped, unless a range
// holds the node's IP, as kube-proxy's allowFromNode decides. A new node
// IP alone, a partial sync of no service, moves them either way.
func TestKernelSourceRangesFromTheNode(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl, func(t *testing.T) {
			topo, b := newCluster(t, Options{Flavour: fl})
			lbIP := netip.MustParseAddr("198.51.100.5")
			shop := service("shop", plan.TCP, 443, 0, []string{vip.String()}, podEP(podB, 1))
			shop.LoadBalancerIPs = []netip.Addr{lbIP}
			shop.SourceRanges = []netip.Prefix{netns.DefaultPodCIDR}
			p := testPlan(shop)
			p.Node.Addresses = []netip.Addr{topo.NodeIP}
			mustSync(t, b, p, backends.FullSync())
			lb := netip.AddrPortFrom(lbIP, 443)
			netns.WantPods(t, "a pod in the ranges", netns.DialMany(t, topo.Pods["pod-a"].NS, lb, 3), "pod-b")
			wantDropped(t, "the node, its IP outside the ranges", topo.Node, lb)

			p.Node.Addresses = []netip.Addr{netip.MustParseAddr("10.244.255.1")}
			mustSync(t, b, p, backends.PartialSync())
			netns.WantPods(t, "the node, its IP in the ranges", netns.DialMany(t, topo.Node, lb, 3), "pod-b")

			p.Node.Addresses = []netip.Addr{topo.NodeIP}
			mustSync(t, b, p, backends.PartialSync())
			wantDropped(t, "the node, its IP outside the ranges again", topo.Node, lb)
			wantDropped(t, "the client, outside the ranges", topo.Client, lb)
		})
	}
}

// wantDropped dials addr from ns and wants nothing back within 300 ms.
func wantDropped(t *testing.T, what string, ns *netns.Namespace, addr netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if a, err := ns.DialTCP(ctx, addr); !errors.Is(err, netns.ErrTimeout) {
		t.Errorf("%s: got answer %v, error %v; want the connection dropped (timeout)", what, a, err)
	}
}
