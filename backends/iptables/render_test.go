package iptables

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/golden"
	"github.com/weirproxy/weir/sdk/plan"
)

// goldEP is a ready endpoint serving Cluster-policy traffic.
func goldEP(addr string, port uint16, weight uint32) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true,
		ForCluster: true, Weight: weight, NodeName: "node-b"}
}

// goldLocal marks endpoints as this node's, serving Local-policy traffic.
func goldLocal(e plan.Endpoint) plan.Endpoint {
	e.Local, e.ForLocal, e.NodeName = true, true, "node-a"
	return e
}

// goldSvc returns a service port with one cluster IP.
func goldSvc(name, port string, proto plan.Protocol, vip string, vport, nodePort uint16, eps ...plan.Endpoint) *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "default", Name: name, Port: port, Protocol: proto},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)},
		Port:       vport, NodePort: nodePort, Endpoints: eps,
	}
}

// goldPlan returns a plan of node-a with the services.
func goldPlan(svcs ...*plan.Service) *plan.Plan {
	p := &plan.Plan{Node: plan.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.2")}},
		Services: map[plan.Key]*plan.Service{}}
	for _, s := range svcs {
		p.Services[s.Key] = s
	}
	return p
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range s {
		out = append(out, netip.MustParsePrefix(a))
	}
	return out
}

// restoreText joins a restore's tables as the golden files show them.
func restoreText(r restore) string {
	var b strings.Builder
	for _, t := range []struct {
		name string
		text []byte
	}{{"filter", r.Filter}, {"nat", r.NAT}} {
		b.WriteString("# table " + t.name + "\n")
		if t.text == nil {
			b.WriteString("# (no restore)\n")
		}
		b.Write(t.text)
	}
	return b.String()
}

var podCIDR = prefixes("10.244.0.0/16")

// goldClusterPlan has cluster IPs only: equal and unequal weights, a
// drained endpoint, UDP, and a service whose only endpoint is drained.
func goldClusterPlan() *plan.Plan {
	return goldPlan(
		goldSvc("web", "http", plan.TCP, "10.96.0.10", 80, 0,
			goldEP("10.244.0.11", 8080, 1), goldEP("10.244.0.12", 8080, 1), goldEP("10.244.0.13", 8080, 1)),
		goldSvc("canary", "", plan.TCP, "10.96.0.11", 80, 0, goldEP("10.244.0.11", 8080, 9), goldEP("10.244.0.12", 8080, 1)),
		goldSvc("dns", "dns", plan.UDP, "10.96.0.53", 53, 0,
			goldEP("10.244.0.14", 53, 1), goldEP("10.244.0.15", 53, 0), goldEP("10.244.0.16", 53, 1)),
		goldSvc("drained", "http", plan.TCP, "10.96.0.12", 80, 0, goldEP("10.244.0.17", 8080, 0)),
	)
}

// goldExternalPlan has a node port, external IPs and a load balancer
// with source ranges, a service without endpoints, and session affinity.
func goldExternalPlan() *plan.Plan {
	np := goldSvc("np", "http", plan.TCP, "10.96.0.20", 80, 30080, goldEP("10.244.0.11", 8080, 1), goldEP("10.244.0.12", 8080, 1))
	np.ExternalIPs = addrs("192.0.2.10")
	lb := goldSvc("shop", "https", plan.TCP, "10.96.0.21", 443, 30443, goldEP("10.244.0.12", 8080, 1))
	lb.LoadBalancerIPs = addrs("198.51.100.5")
	// The node's range (goldPlan: 192.168.0.2): its load-balancer IP is
	// an allowed source too.
	lb.SourceRanges = prefixes("10.244.0.0/24", "192.168.0.0/24")
	empty := goldSvc("empty", "dns", plan.UDP, "10.96.0.53", 53, 30053)
	// Without endpoints: rejected for every source, no firewall.
	emptyLB := goldSvc("closed", "http", plan.TCP, "10.96.0.22", 80, 30081)
	emptyLB.LoadBalancerIPs = addrs("198.51.100.6")
	emptyLB.SourceRanges = prefixes("10.244.0.0/24")
	// Endpoints, none serving (drained): no nat chain, so the allowed
	// ranges return in filter before the drop.
	drained := goldSvc("drained", "http", plan.TCP, "10.96.0.24", 80, 0, goldEP("10.244.0.13", 8080, 0))
	drained.LoadBalancerIPs = addrs("198.51.100.7")
	drained.SourceRanges = prefixes("10.244.0.0/24")
	sticky := goldSvc("sticky", "http", plan.TCP, "10.96.0.23", 80, 30082,
		goldEP("10.244.0.11", 8080, 1), goldEP("10.244.0.12", 8080, 1), goldEP("10.244.0.13", 8080, 0))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 10800}
	return goldPlan(np, lb, empty, emptyLB, drained, sticky)
}

// goldPolicyPlan has traffic policies: ETP Local with local and remote
// endpoints and a health-check port, ETP Local with remote endpoints only
// (drop, but node and pod traffic still reach the cluster's endpoints),
// ITP Local with a local endpoint and with remote ones only (drop), and
// both policies Local.
func goldPolicyPlan() *plan.Plan {
	etp := goldSvc("edge", "http", plan.TCP, "10.96.0.30", 80, 30080,
		goldLocal(goldEP("10.244.0.11", 8080, 1)), goldEP("10.244.0.12", 8080, 1))
	etp.ExternalLocal, etp.HealthCheckNodePort = true, 32000
	etp.LoadBalancerIPs = addrs("198.51.100.5")
	remote := goldSvc("remote", "http", plan.TCP, "10.96.0.31", 80, 30081, goldEP("10.244.0.12", 8080, 1))
	remote.ExternalLocal, remote.HealthCheckNodePort = true, 32001
	remote.LoadBalancerIPs = addrs("198.51.100.6")
	itp := goldSvc("itp", "http", plan.TCP, "10.96.0.32", 80, 0, goldLocal(goldEP("10.244.0.11", 8080, 1)), goldEP("10.244.0.12", 8080, 1))
	itp.InternalLocal = true
	itpRemote := goldSvc("itp-remote", "http", plan.TCP, "10.96.0.33", 80, 0, goldEP("10.244.0.12", 8080, 1))
	itpRemote.InternalLocal = true
	both := goldSvc("both", "http", plan.TCP, "10.96.0.34", 80, 30084, goldLocal(goldEP("10.244.0.11", 8080, 1)), goldEP("10.244.0.12", 8080, 1))
	both.InternalLocal, both.ExternalLocal = true, true
	return goldPlan(etp, remote, itp, itpRemote, both)
}

// goldDetectorPlan has one cluster IP and one Local-policy node port, the
// two places local traffic detection shows.
func goldDetectorPlan() *plan.Plan {
	etp := goldSvc("edge", "http", plan.TCP, "10.96.0.30", 80, 30080, goldLocal(goldEP("10.244.0.11", 8080, 1)), goldEP("10.244.0.12", 8080, 1))
	etp.ExternalLocal = true
	p := goldPlan(goldSvc("web", "http", plan.TCP, "10.96.0.10", 80, 0, goldEP("10.244.0.11", 8080, 1)), etp)
	p.Node.PodCIDRs = prefixes("10.244.0.0/24", "fd00:10:244::/64")
	return p
}

// goldDualStackPlan has a dual-stack service, an IPv4-only one with a node
// port and an IPv6-only one.
func goldDualStackPlan() *plan.Plan {
	dual := goldSvc("dual", "http", plan.TCP, "10.96.0.10", 80, 30080,
		goldEP("10.244.0.11", 8080, 1), goldEP("fd00:10:244::11", 8080, 1), goldEP("fd00:10:244::13", 8080, 1))
	dual.ClusterIPs = addrs("10.96.0.10", "fd00:10:96::10")
	dual.ExternalIPs = addrs("192.0.2.10", "2001:db8::10")
	v4 := goldSvc("v4", "http", plan.TCP, "10.96.0.11", 80, 30081, goldEP("10.244.0.12", 8080, 1))
	v6 := goldSvc("v6", "dns", plan.UDP, "fd00:10:96::53", 53, 0)
	v6.Affinity = &plan.Affinity{TimeoutSeconds: 60}
	v6.Endpoints = []plan.Endpoint{goldEP("fd00:10:244::12", 53, 1)}
	p := goldPlan(dual, v4, v6)
	p.Node.Addresses = addrs("192.168.0.2", "fd00::2")
	return p
}

func TestGoldenFull(t *testing.T) {
	cidrs := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	cases := []struct {
		name     string
		f        ipFamily
		o        *Options
		p        *plan.Plan
		existing map[string][]string
	}{
		{"full-clusterip", ipv4, cidrs, goldClusterPlan(), nil},
		{"full-external", ipv4, cidrs, goldExternalPlan(), nil},
		{"full-policy", ipv4, cidrs, goldPolicyPlan(), nil},
		{"full-detect-none", ipv4, &Options{}, goldDetectorPlan(), nil},
		{"full-detect-clustercidr", ipv4, &Options{Common: backends.Common{ClusterCIDRs: prefixes("10.244.0.0/16", "fd00:10:244::/48")}}, goldDetectorPlan(), nil},
		{"full-detect-clustercidrs", ipv4, &Options{Common: backends.Common{ClusterCIDRs: prefixes("10.244.0.0/16", "10.245.0.0/16")}}, goldDetectorPlan(), nil},
		{"full-detect-nodecidr", ipv4, &Options{Common: backends.Common{LocalDetector: backends.DetectNodeCIDR}}, goldDetectorPlan(), nil},
		{"full-detect-nodecidr-unknown", ipv4, &Options{Common: backends.Common{LocalDetector: backends.DetectNodeCIDR}}, func() *plan.Plan {
			p := goldDetectorPlan()
			p.Node.PodCIDRs = nil
			return p
		}(), nil},
		{"full-detect-interface", ipv4, &Options{Common: backends.Common{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth"}}, goldDetectorPlan(), nil},
		{"full-masquerade-all", ipv4, &Options{Common: backends.Common{ClusterCIDRs: podCIDR, MasqueradeAll: true}}, goldDetectorPlan(), nil},
		{"full-nodeport-localhost", ipv4, &Options{Common: backends.Common{LocalhostNodePorts: true}}, goldPolicyPlan(), nil},
		{"full-nodeport-cidrs", ipv4, &Options{Common: backends.Common{NodePortCIDRs: prefixes("192.168.0.0/24", "127.0.0.0/8", "fd00::/64")}}, goldDetectorPlan(), nil},
		{"full-nodeport-primary", ipv4, &Options{Common: backends.Common{NodePortPrimary: true}}, goldDetectorPlan(), nil},
		{"full-ipv6", ipv6, &Options{Common: backends.Common{ClusterCIDRs: prefixes("10.244.0.0/16", "fd00:10:244::/48")}}, goldDualStackPlan(), nil},
		{"full-ipv4-of-dual-stack", ipv4, &Options{Common: backends.Common{ClusterCIDRs: prefixes("10.244.0.0/16", "fd00:10:244::/48")}}, goldDualStackPlan(), nil},
		{"full-orphans", ipv4, cidrs, goldPlan(goldSvc("web", "http", plan.TCP, "10.96.0.10", 80, 0, goldEP("10.244.0.11", 8080, 1))),
			map[string][]string{
				"nat": {"KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-MARK-DROP", "KUBE-SVC-CDGGSHYLG3RE2FKL", "KUBE-SEP-QZSIC2ZS53EHPBVZ",
					"KUBE-SVC-AAAAAAAAAAAAAAAA", "KUBE-SEP-BBBBBBBBBBBBBBBB", "KUBE-XLB-CCCCCCCCCCCCCCCC", "KUBE-SEP-BBBBBBBBBBBBBBBB"},
				"filter": {"KUBE-FIREWALL", "KUBE-SERVICES", "KUBE-EXT-DDDDDDDDDDDDDDDD"},
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, w := renderFull(c.f, c.p, c.o, c.existing)
			golden.Compare(t, filepath.Join("testdata", c.name+".golden"), restoreText(r))
			k := fakeKernel{}
			if c.existing != nil {
				k.applyRestore(t, fakeExisting(c.existing))
			}
			k.applyRestore(t, r)
			for table, chains := range k {
				for c := range chains {
					if isServiceChain(c) && (table != "nat" || !w.natChains()[c]) {
						t.Errorf("%s chain %s is in the kernel but not written", table, c)
					}
				}
			}
		})
	}
}

// fakeExisting returns a restore that creates the chains.
func fakeExisting(existing map[string][]string) restore {
	var r restore
	for table, chains := range existing {
		text := declare([]byte("*"+table+"\n"), chains...)
		text = append(text, "COMMIT\n"...)
		if table == "nat" {
			r.NAT = text
		} else {
			r.Filter = text
		}
	}
	return r
}

// TestLegacyDeclaresChainsDescending checks the order of the per-service
// chain declarations: descending names for iptables-legacy, the plan's
// order (names are hashes, so no name order) otherwise.
func TestLegacyDeclaresChainsDescending(t *testing.T) {
	p := goldClusterPlan()
	declared := func(o *Options) []string {
		r, _ := renderFull(ipv4, p, o, nil)
		var names []string
		for line := range strings.Lines(string(r.NAT)) {
			if name, ok := strings.CutPrefix(line, ":"); ok && isServiceChain(strings.Fields(name)[0]) {
				names = append(names, strings.Fields(name)[0])
			}
		}
		return names
	}
	legacy := declared(&Options{Flavour: flavourLegacy})
	if len(legacy) < 3 || !slices.IsSortedFunc(legacy, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("legacy declarations not in descending order: %v", legacy)
	}
	if nft := declared(&Options{Flavour: flavourNFT}); slices.IsSorted(nft) || slices.IsSortedFunc(nft, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("nft declarations in name order: %v", nft)
	}
}
