//go:build vm

package ipvs

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelReadBackNamesTampering reads back a node serving Local
// services with source ranges and a short circuit, tampers with the
// filter, mangle and IPVS parts one at a time, and checks that the
// read-back names each service and field, and that a full sync makes it
// match the plan again. The ranges hold the node's IP, so the node's own
// connections, which leave from the load-balancer IP, get in.
func TestKernelReadBackNamesTampering(t *testing.T) {
	f := newRepairFixture(t, FlavourNFT)
	lb := service("lb", plan.TCP, 80, 30090, []string{"10.96.0.30"}, localEP(podA.String(), podPort), podEP(podB, 1))
	lb.ExternalLocal = true
	lb.Scheduler = plan.SchedulerWeightedRoundRobin
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	lb.SourceRanges = []netip.Prefix{netip.PrefixFrom(f.topo.ClientIP, 32), netip.PrefixFrom(f.topo.NodeIP, 32)}
	f.p.Node.Addresses = []netip.Addr{f.topo.NodeIP}
	remote := service("remote", plan.TCP, 80, 30091, []string{"10.96.0.31"}, podEP(podC, 1))
	remote.ExternalLocal = true
	remote.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.31")}
	f.p.Services[lb.Key], f.p.Services[remote.Key] = lb, remote
	mustSync(t, f.b, f.p, backends.FullSync())
	if d := f.divergences(t); d != "" {
		t.Fatalf("after the first sync the read-back diverges:\n%s", d)
	}
	netns.WantPods(t, "load-balancer IP from an allowed client", netns.DialMany(t, f.topo.Client, netip.MustParseAddrPort("198.51.100.5:80"), 4), "pod-a")
	netns.WantPods(t, "load-balancer IP from the node (short circuit)", netns.DialMany(t, f.topo.Node, netip.MustParseAddrPort("198.51.100.5:80"), 8), "pod-a", "pod-b")

	lbCluster := vsKey{addr: netip.MustParseAddr("10.96.0.30"), proto: plan.TCP, port: 80}
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T)
		want   []string
	}{
		{"filter jump deleted", func(t *testing.T) {
			f.iptables(t, 4, "-D", "INPUT", "-m", "comment", "--comment", "weir IPVS source ranges and Local-policy drops", "-j", chainFilter)
		}, []string{
			"default/lb:p/TCP (external IP 198.51.100.5:80/TCP): source ranges: want 172.30.0.1/32 172.30.0.2/32 198.51.100.5/32, got everyone",
			"default/remote:p/TCP (external IP 192.0.2.31:80/TCP): verdict: want drop, got reject",
			"anomaly: IPv4 filter chain INPUT does not jump to WEIR-IPVS-FILTER",
		}},
		{"short-circuit rules flushed", func(t *testing.T) {
			f.iptables(t, 4, "-t", "mangle", "-F", chainShortCircuit)
		}, []string{
			"default/lb:p/TCP (external IP 198.51.100.5:80/TCP): short-circuit: want 10.244.0.11:8080*1 10.244.0.12:8080*1, got none",
			"default/lb:p/TCP (node port 0.0.0.0:30090/TCP): short-circuit: want 10.244.0.11:8080*1 10.244.0.12:8080*1, got none",
			"anomaly: firewall-mark virtual servers no short-circuit rule uses: FWM 65536 IPv4",
		}},
		{"weight changed", func(t *testing.T) {
			must(t, "reweight", f.ipvsBehindTheBack(t).UpdateDestination(toService(lbCluster, nil), toDestination(netip.AddrPortFrom(podA, podPort), 5)))
		}, []string{
			"default/lb:p/TCP (cluster IP 10.96.0.30:80/TCP): endpoints: want 10.244.0.11:8080*1 10.244.0.12:8080*1, got 10.244.0.11:8080*5 10.244.0.12:8080*1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tamper(t)
			got := f.divergences(t)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("read back after the tampering:\n%s\nwant a line %q", got, w)
				}
			}
			if err := f.b.Sync(context.Background(), f.p, backends.FullSync()); err != nil {
				t.Fatalf("full sync: %v", err)
			}
			if d := f.divergences(t); d != "" {
				t.Errorf("after a full sync the read-back still diverges:\n%s", d)
			}
		})
	}
}
