package nftables

import (
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weirproxy/weir/backends"
	goldenfile "github.com/weirproxy/weir/internal/golden"
	"github.com/weirproxy/weir/sdk/plan"
)

// golden compares got with testdata/name; go test -update rewrites it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	goldenfile.Compare(t, filepath.Join("testdata", name), got)
}

// ep returns a ready endpoint of the cluster's pool, on this node (as the
// kernel tests' pods are) unless a test says otherwise.
func ep(addr string, port uint16, weight uint32) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true, ForCluster: true, Local: true, Weight: weight}
}

func svc(ns, name, port string, proto plan.Protocol, vip string, vport, nodePort uint16, eps ...plan.Endpoint) *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: ns, Name: name, Port: port, Protocol: proto},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)},
		Port:       vport, NodePort: nodePort, Endpoints: eps,
	}
}

// etpLocal sets externalTrafficPolicy Local; the endpoints at local
// addresses run on this node and serve local traffic.
func etpLocal(s *plan.Service, local ...string) *plan.Service {
	s.ExternalLocal = true
	for i, e := range s.Endpoints {
		s.Endpoints[i].Local = slices.Contains(local, e.Address.String())
		s.Endpoints[i].ForLocal = s.Endpoints[i].Local
	}
	return s
}

// withExternalIPs sets the service's external IPs.
func withExternalIPs(s *plan.Service, ips ...string) *plan.Service {
	for _, ip := range ips {
		s.ExternalIPs = append(s.ExternalIPs, netip.MustParseAddr(ip))
	}
	return s
}

func testPlan(svcs ...*plan.Service) *plan.Plan {
	p := &plan.Plan{Services: map[plan.Key]*plan.Service{}}
	for _, s := range svcs {
		p.Services[s.Key] = s
	}
	return p
}

// offlineBackend returns the IPv4 table of a backend that never talks to
// the kernel: its transactions are only rendered.
func offlineBackend(opts Options) *table {
	if opts.Table == "" {
		opts.Table = "weir"
	}
	return newTables(opts)[0]
}

// fullPlan is the plan of the full-sync golden: cluster IPs, weights, UDP,
// a service without endpoints, and Local policies with and without a local
// endpoint.
func fullPlan() *plan.Plan {
	return testPlan(
		svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 0, ep("10.244.0.11", 8080, 1), ep("10.244.0.12", 8080, 1)),
		svc("default", "canary", "", plan.TCP, "10.96.0.12", 80, 30080, ep("10.244.0.11", 8080, 3), ep("10.244.0.13", 8080, 1)),
		svc("default", "dns", "dns", plan.UDP, "10.96.0.53", 53, 0, ep("10.244.0.14", 53, 1), ep("10.244.0.15", 53, 1)),
		withExternalIPs(svc("default", "empty", "http", plan.TCP, "10.96.0.20", 80, 30081), "192.0.2.20"),
		etpLocal(svc("default", "edge", "http", plan.TCP, "10.96.0.30", 80, 30082,
			ep("10.244.0.11", 8080, 1), ep("10.244.1.11", 8080, 1)), "10.244.0.11"),
		etpLocal(svc("default", "edge-elsewhere", "http", plan.TCP, "10.96.0.31", 80, 30083,
			ep("10.244.1.12", 8080, 1))),
	)
}

var goldenCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}

func TestGoldenFullSync(t *testing.T) {
	b := offlineBackend(Options{Common: backends.Common{ClusterCIDRs: goldenCIDRs[:1]}})
	p := fullPlan()
	p.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")}
	tx, _ := b.fullTxn(p, nil)
	golden(t, "full.nft", tx.String())
}

// TestGoldenRefill shows a periodic full sync: the table stays, every object
// is emptied and refilled, and the affinity sets are left alone.
func TestGoldenRefill(t *testing.T) {
	b := offlineBackend(Options{})
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 0, ep("10.244.0.11", 8080, 1), ep("10.244.0.12", 8080, 1))
	web.Affinity = &plan.Affinity{TimeoutSeconds: 60}
	p := testPlan(web)
	_, c := b.fullTxn(p, nil)
	c.commit()
	b.state, b.synced = c.base, true
	tx, _ := b.fullTxn(p, nil)
	golden(t, "full-refill.nft", tx.String())
}

func TestGoldenPartialSync(t *testing.T) {
	b := offlineBackend(Options{Common: backends.Common{MasqueradeAll: true}})
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 0, ep("10.244.0.11", 8080, 1), ep("10.244.0.12", 8080, 1))
	other := svc("default", "other", "http", plan.TCP, "10.96.0.11", 80, 0, ep("10.244.0.13", 8080, 1), ep("10.244.0.14", 8080, 1))
	p := testPlan(web, other)
	tx, c := b.fullTxn(p, nil)
	c.commit()
	b.state = c.base
	_ = tx

	// Replace one endpoint: only its bucket changes.
	web2 := web.Clone()
	web2.Endpoints[1] = ep("10.244.0.15", 8080, 1)
	p.Services[web.Key] = web2
	tx, c = b.partialTxn(p, []plan.Key{web.Key}, nil)
	golden(t, "partial-replace.nft", tx.String())
	c.commit()

	// Remove an endpoint: the service moves to the weight-1 pick chain.
	web3 := web2.Clone()
	web3.Endpoints = web3.Endpoints[:1]
	p.Services[web.Key] = web3
	tx, c = b.partialTxn(p, []plan.Key{web.Key}, nil)
	golden(t, "partial-scale-down.nft", tx.String())
	c.commit()

	// Delete the service: its pick chain goes with it.
	delete(p.Services, web.Key)
	tx, _ = b.partialTxn(p, []plan.Key{web.Key}, nil)
	golden(t, "partial-delete.nft", tx.String())
}

func TestBucketsFollowWeights(t *testing.T) {
	cases := []struct {
		weights []uint32
		want    []int
	}{
		{[]uint32{1, 1, 1}, []int{1, 1, 1}},
		{[]uint32{3, 1}, []int{3, 1}},
		{[]uint32{30, 10}, []int{3, 1}},
		{[]uint32{0, 2}, []int{0, 1}},
		{[]uint32{1_000_000, 1}, []int{maxBuckets - 1, 1}}, // scaled to fit maxBuckets
	}
	for _, c := range cases {
		var eps []plan.Endpoint
		for i, w := range c.weights {
			eps = append(eps, ep(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}).String(), 80, w))
		}
		got := map[netip.AddrPort]int{}
		for _, b := range buckets(famV4, eps, false) {
			got[b]++
		}
		for i, e := range eps {
			if got[e.AddrPort()] != c.want[i] {
				t.Errorf("weights %v: endpoint %d has %d buckets, want %d", c.weights, i, got[e.AddrPort()], c.want[i])
			}
		}
	}
}

// TestGoldenIPv6 renders the ip6 table of a dual-stack plan.
func TestGoldenIPv6(t *testing.T) {
	tb := newTables(Options{Common: backends.Common{ClusterCIDRs: goldenCIDRs}, Table: "weir"})[1]
	tx, _ := tb.fullTxn(testPlan(dualStackSticky()), nil)
	golden(t, "full-ipv6.nft", tx.String())
}

// dualStackSticky is a dual-stack service with ClientIP affinity, a node
// port and a load-balancer IP limited to a source range.
func dualStackSticky() *plan.Service {
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 30080,
		ep("10.244.0.11", 8080, 1), ep("fd00:10:244::11", 8080, 1), ep("fd00:10:244::12", 8080, 1))
	web.ClusterIPs = append(web.ClusterIPs, netip.MustParseAddr("fd00:10:96::10"))
	web.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("2001:db8::5")}
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}
	web.Affinity = &plan.Affinity{TimeoutSeconds: 30}
	return web
}
