package iptables

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// readBackPlan adds to repairPlan what the read-back must also rebuild:
// sticky, ClientIP affinity over weights 3 and 1; lb, a load balancer with
// source ranges and a Local external policy (pod-c local, pod-a not: the
// node's own traffic is short-circuited to both); idle, endpoints none of
// which may serve (dropped).
func readBackPlan() *plan.Plan {
	p := repairPlan()
	sticky := ktService("sticky", netip.MustParseAddr("10.96.0.20"), ktPodA, ktPodB)
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	sticky.Endpoints[0].Weight = 3
	lb := ktService("lb", netip.MustParseAddr("10.96.0.21"), ktPodC, ktPodA)
	lb.Port, lb.NodePort, lb.HealthCheckNodePort = 443, 30443, 32000
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24"), netip.MustParsePrefix("fd00:172:30::/64")}
	lb.ExternalLocal = true
	lb.Endpoints[0].ForLocal, lb.Endpoints[0].Local = true, true
	idle := ktService("idle", netip.MustParseAddr("10.96.0.22"), ktPodB)
	idle.Endpoints[0].ForCluster = false
	for _, s := range []*plan.Service{sticky, lb, idle} {
		p.Services[s.Key] = s
	}
	return p
}

// wantDivergence checks that divs name service (empty for an anomaly) and
// field, with a text containing detail.
func wantDivergence(t *testing.T, what string, divs []backends.Divergence, service, field, detail string) {
	t.Helper()
	for _, d := range divs {
		if d.Field == field && (service == "" || d.Service == repairKey(service)) && strings.Contains(d.String(), detail) {
			return
		}
	}
	var all []string
	for _, d := range divs {
		all = append(all, d.String())
	}
	t.Errorf("%s: no %s divergence of %q mentioning %q among:\n%s", what, field, service, detail, strings.Join(all, "\n"))
}

// TestKernelReadBack syncs a plan with every kind of destination and
// forwarding, in both families: what ReadBack reads must be what Expected
// says. Then, after each way of changing the rules by hand, the
// comparison must name the service and the field that changed (or the
// anomaly), and a rewrite must make it empty again.
func TestKernelReadBack(t *testing.T) {
	web := servicePortName(repairKey("web"))
	webSVC, sepA := webChains()
	sticky := chainsFor(servicePortName(repairKey("sticky")), "tcp").svc
	for _, c := range []struct {
		name           string
		tamper         func(h hand)
		service, field string
		detail         string
	}{
		{"endpoint-chain-deleted", func(h hand) { h.removeChain(ipv4, "nat", sepA) }, "web", "endpoints", "got 10.244.0.12:8080*1"},
		{"dispatch-flushed", func(h hand) { h.ipt(ipv4, "-t", "nat", "-F", kubeServices) }, "web", "destination", "cluster IP 10.96.0.10:80/TCP"},
		{"probability-changed", func(h hand) {
			h.ipt(ipv4, "-t", "nat", "-R", webSVC, "1", "-m", "statistic", "--mode", "random", "--probability", "0.9", "-j", sepA)
		}, "web", "endpoints", "got 10.244.0.11:8080*9 10.244.0.12:8080*1"},
		{"affinity-removed", func(h hand) {
			h.ipt(ipv4, "-t", "nat", "-D", sticky, "1")
			h.ipt(ipv4, "-t", "nat", "-D", sticky, "1")
		}, "sticky", "affinity", "want 600, got 0"},
		{"reject-deleted", func(h hand) { h.ipt(ipv4, "-F", kubeServices) }, "none", "destination", "want present (reject), got missing"},
		{"firewall-flushed", func(h hand) { h.ipt(ipv4, "-F", kubeProxyFirewall) }, "", "anomaly", "does not drop them"},
		{"jump-deleted", func(h hand) {
			h.ipt(ipv4, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", commentServices, "-j", kubeServices)
		}, "", "anomaly", "nat chain PREROUTING has no jump to KUBE-SERVICES"},
		{"ipv6-endpoint-retargeted", func(h hand) {
			sep6 := endpointChain(web, "tcp", netip.AddrPortFrom(ktPodA6, ktPort))
			h.ipt(ipv6, "-t", "nat", "-R", sep6, "2", "-p", "tcp", "-j", "DNAT", "--to-destination", "[fd00:10:244::99]:8080")
		}, "web", "endpoints", "[fd00:10:244::99]:8080*1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			eachFlavour(t, func(t *testing.T, fl string) {
				topo := ktTopology(t)
				b := ktBackend(t, topo, fl)
				b.opts.RewritePeriod = time.Nanosecond // every full sync rewrites
				p := readBackPlan()
				ktSync(t, b, p, backends.FullSync())
				for _, d := range ktDivergences(t, b, p) {
					t.Errorf("after the sync: %s", d)
				}
				c.tamper(hand{t, topo, b.fl})
				wantDivergence(t, "after the tampering", ktDivergences(t, b, p), c.service, c.field, c.detail)
				ktSync(t, b, p, backends.FullSync())
				for _, d := range ktDivergences(t, b, p) {
					t.Errorf("after the rewrite: %s", d)
				}
			})
		})
	}
}

// TestKernelReadBackOfNothing reads back a namespace where Weir never ran:
// no destination, and the missing chains and jumps as anomalies.
func TestKernelReadBackOfNothing(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		v, err := b.ReadBack(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Destinations) != 0 {
			t.Errorf("destinations in an empty namespace: %v", v.Destinations)
		}
		joined := strings.Join(v.Anomalies, "\n")
		for _, want := range []string{"IPv4 nat chain KUBE-SERVICES is missing", "IPv6 filter chain INPUT has no jump to KUBE-PROXY-FIREWALL"} {
			if !strings.Contains(joined, want) {
				t.Errorf("anomalies do not say %q:\n%s", want, joined)
			}
		}
	})
}

// TestKernelReadBackNodePortOptions reads back node ports under each way
// of choosing where they are served: everywhere but loopback, on
// 127.0.0.1 too, in IPv4 node-port CIDRs only (no IPv6 node ports), and
// on the Node's own addresses.
func TestKernelReadBackNodePortOptions(t *testing.T) {
	for name, common := range map[string]backends.Common{
		"default":   {},
		"localhost": {LocalhostNodePorts: true},
		"cidrs":     {NodePortCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}},
		"primary":   {NodePortPrimary: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachFlavour(t, func(t *testing.T, fl string) {
				topo := ktTopology(t)
				c := common
				c.NetNS = topo.Node.Fd()
				b, err := New(Options{Common: c, Flavour: fl})
				if err != nil {
					t.Fatal(err)
				}
				p := readBackPlan()
				p.Node.Addresses = []netip.Addr{topo.NodeIP, topo.NodeIP6}
				ktSync(t, b, p, backends.FullSync())
				for _, d := range ktDivergences(t, b, p) {
					t.Errorf("after the sync: %s", d)
				}
				if _, owners := b.Expected(p); name == "cidrs" && slices.ContainsFunc(slices.Collect(maps.Keys(owners)), func(d backends.Destination) bool {
					return d.Kind == backends.DestNodePort && d.Addr.Is6()
				}) {
					t.Error("Expected has IPv6 node ports though nodePortAddresses has only IPv4 ranges")
				}
			})
		})
	}
}
