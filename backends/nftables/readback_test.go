package nftables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// ReadBack tests: the kernel's tables, read back, must show exactly what
// the committed plan expects, and name what another process changed.

var (
	vip6   = netip.MustParseAddr("fd00:10:96::10")
	pod6A  = netip.MustParseAddr("fd00:10:244::11")
	extIP  = netip.MustParseAddr("192.0.2.10")
	lbIP   = netip.MustParseAddr("198.51.100.5")
	lbIP6  = netip.MustParseAddr("2001:db8::5")
	nodeIP = netip.MustParseAddr("172.30.0.1")
)

// variedPlan has a service of every shape the layout writes: weights,
// dual-stack, external and load-balancer IPs with source ranges, affinity,
// Local policies with and without local endpoints, no endpoints at all,
// drained endpoints, UDP and IPv6 only.
func variedPlan() *plan.Plan {
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1), podEP(podB, 3), ep(pod6A.String(), podPort, 1))
	web.ClusterIPs = append(web.ClusterIPs, vip6)
	web.ExternalIPs = []netip.Addr{extIP}
	web.LoadBalancerIPs = []netip.Addr{lbIP, lbIP6}
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.30.0.0/24")}
	sticky := svc("default", "sticky", "http", plan.TCP, "10.96.0.11", 80, 30081, podEP(podA, 1), podEP(podC, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	local := svc("default", "local", "http", plan.TCP, "10.96.0.12", 80, 30082,
		policyEP(podA, true, true), policyEP(podB, true, false))
	local.ExternalLocal = true
	local.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.12")}
	elsewhere := svc("default", "elsewhere", "http", plan.TCP, "10.96.0.13", 80, 30083, policyEP(podB, true, false))
	elsewhere.ExternalLocal = true
	elsewhere.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.13")}
	internal := svc("default", "internal", "http", plan.TCP, "10.96.0.14", 80, 0, policyEP(podB, false, false))
	internal.InternalLocal = true
	empty := withExternalIPs(svc("default", "empty", "http", plan.TCP, "10.96.0.15", 80, 30085), "192.0.2.15")
	drained := svc("default", "drained", "http", plan.TCP, "10.96.0.16", 80, 0, podEP(podA, 0))
	dns := svc("kube-system", "dns", "dns", plan.UDP, "10.96.0.53", 53, 0, ep(podA.String(), 53, 1), ep(podB.String(), 53, 1))
	only6 := svc("default", "only6", "http", plan.TCP, "fd00:10:96::17", 80, 30087, ep(pod6A.String(), podPort, 2))
	p := testPlan(web, sticky, local, elsewhere, internal, empty, drained, dns, only6)
	p.Node = plan.Node{Name: "node", Addresses: []netip.Addr{nodeIP}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}}
	return p
}

// readBackBackend programs a node namespace of its own with opts.
func readBackBackend(t *testing.T, opts Options) (*netns.Topology, *Backend) {
	t.Helper()
	topo := netns.NewT(t, netns.Options{})
	opts.NetNS = topo.Node.Fd()
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return topo, b
}

// divergences compares what ReadBack returns with what p expects.
func divergences(t *testing.T, b *Backend, p *plan.Plan) []backends.Divergence {
	t.Helper()
	got, err := b.ReadBack(context.Background())
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	want, owners := b.Expected(p)
	return backends.Compare(want, owners, got)
}

func wantNoDivergence(t *testing.T, what string, b *Backend, p *plan.Plan) {
	t.Helper()
	for _, d := range divergences(t, b, p) {
		t.Errorf("%s: %s", what, d)
	}
}

// optionSets are the backend options the read-back and sequence tests run
// with.
var optionSets = []struct {
	name string
	opts backends.Common
}{
	{"defaults", backends.Common{}},
	{"cluster CIDRs and localhost node ports", backends.Common{LocalhostNodePorts: true,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}}},
	{"IPv4 node-port addresses", backends.Common{NodePortCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}}},
	{"primary node-port addresses", backends.Common{NodePortPrimary: true}},
	{"node CIDR detector", backends.Common{LocalDetector: backends.DetectNodeCIDR}},
	{"node CIDR detector, primary node-port addresses", backends.Common{LocalDetector: backends.DetectNodeCIDR, NodePortPrimary: true}},
	{"interface detector, masquerade all", backends.Common{MasqueradeAll: true,
		LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth"}},
}

func TestKernelReadBackMatchesPlan(t *testing.T) {
	for _, o := range optionSets {
		t.Run(o.name, func(t *testing.T) {
			_, b := readBackBackend(t, Options{Common: o.opts})
			p := variedPlan()
			mustSync(t, b, p, backends.FullSync())
			if want, _ := b.Expected(p); len(want.Destinations) < 20 {
				t.Fatalf("the varied plan expects only %d destinations", len(want.Destinations))
			}
			wantNoDivergence(t, "after the full sync", b, p)

			for _, step := range partialSteps {
				keys := step.change(p)
				mustSync(t, b, p, backends.PartialSync(keys...))
				wantNoDivergence(t, "after "+step.name, b, p)
			}
			mustSync(t, b, p, backends.FullSync())
			wantNoDivergence(t, "after a periodic full sync", b, p)
		})
	}
}

// partialSteps change the varied plan, each returning the keys it touched.
var partialSteps = []struct {
	name   string
	change func(p *plan.Plan) []plan.Key
}{
	{"moving web's endpoints", func(p *plan.Plan) []plan.Key {
		return edit(p, "web", func(s *plan.Service) { s.Endpoints[1] = podEP(podC, 2) })
	}},
	{"giving empty endpoints", func(p *plan.Plan) []plan.Key {
		return edit(p, "empty", func(s *plan.Service) { s.Endpoints = []plan.Endpoint{podEP(podA, 1)} })
	}},
	{"dropping sticky's affinity and source ranges on web", func(p *plan.Plan) []plan.Key {
		return append(edit(p, "sticky", func(s *plan.Service) { s.Affinity = nil }),
			edit(p, "web", func(s *plan.Service) { s.SourceRanges = nil })...)
	}},
	{"local losing its local endpoint", func(p *plan.Plan) []plan.Key {
		return edit(p, "local", func(s *plan.Service) { s.Endpoints = s.Endpoints[1:] })
	}},
	{"deleting dns and adding another", func(p *plan.Plan) []plan.Key {
		var dns plan.Key
		for k, s := range p.Services {
			if s.Key.Name == "dns" {
				dns = k
			}
		}
		delete(p.Services, dns)
		added := svc("default", "added", "http", plan.TCP, "10.96.0.18", 8080, 30088, podEP(podB, 1))
		p.Services[added.Key] = added
		return []plan.Key{dns, added.Key}
	}},
}

// edit changes a clone of the named service of p and returns its key.
func edit(p *plan.Plan, name string, change func(*plan.Service)) []plan.Key {
	for k, s := range p.Services {
		if s.Key.Name == name {
			c := s.Clone()
			change(c)
			p.Services[k] = c
			return []plan.Key{k}
		}
	}
	panic("no service " + name)
}

// TestKernelReadBackSeesTheKernel compares the kernel's rules for one plan
// with another plan's expectation: every difference must be named, by
// service and field, so ReadBack reports what the kernel holds and not what
// it is told.
func TestKernelReadBackSeesTheKernel(t *testing.T) {
	_, b := readBackBackend(t, Options{})
	committed := variedPlan()
	mustSync(t, b, committed, backends.FullSync())
	other := variedPlan()
	edit(other, "web", func(s *plan.Service) { s.Endpoints[1].Weight = 1 })
	edit(other, "sticky", func(s *plan.Service) { s.Affinity.TimeoutSeconds = 300 })
	edit(other, "web", func(s *plan.Service) { s.SourceRanges = s.SourceRanges[:1] })
	edit(other, "local", func(s *plan.Service) { s.ExternalLocal = false })
	edit(other, "empty", func(s *plan.Service) { s.Endpoints = []plan.Endpoint{podEP(podA, 1)} })
	edit(other, "dns", func(s *plan.Service) { s.Port = 5353 })
	divs := divergences(t, b, other)
	for _, want := range []struct{ service, field string }{
		{"web", "endpoints"}, {"sticky", "affinity"}, {"web", "source ranges"}, {"local", "short-circuit"},
		{"empty", "verdict"}, {"dns", "destination"},
	} {
		if !hasDivergence(divs, want.service, want.field) {
			t.Errorf("no %s divergence named for %s; got:\n%s", want.field, want.service, formatDivergences(divs))
		}
	}
}

func hasDivergence(divs []backends.Divergence, service, field string) bool {
	for _, d := range divs {
		if d.Service.Name == service && d.Field == field {
			return true
		}
	}
	return false
}

func hasAnomaly(divs []backends.Divergence, text string) bool {
	for _, d := range divs {
		if d.Field == "anomaly" && strings.Contains(d.Got, text) {
			return true
		}
	}
	return false
}

func formatDivergences(divs []backends.Divergence) string {
	var b strings.Builder
	for _, d := range divs {
		b.WriteString("  " + d.String() + "\n")
	}
	return b.String()
}

// readBackTamperings say what ReadBack must name after each tampering of
// the repair tests: a divergence of web's (field) or an anomaly (text).
var readBackTamperings = map[string][]struct{ field, text string }{
	"flush ruleset":                         {{"destination", ""}, {"", "table ip weir: the table is missing"}, {"", "table ip6 weir: the table is missing"}},
	"delete table":                          {{"destination", ""}, {"", "table ip weir: the table is missing"}},
	"delete endpoints map":                  {{"destination", ""}, {"", "pick chain pick-ip-3 differs from Weir's layout"}},
	"delete pick chain":                     {{"destination", ""}},
	"delete elements":                       {{"destination", ""}},
	"base chain policy drop":                {{"", "chain filter-forward is hooked as"}},
	"foreign chain jumping to a pick chain": {{"", "chain intruder is not Weir's"}},
	"foreign rule using an endpoints map":   {{"", "chain intruder is not Weir's"}},
	"flush sticky chain":                    {{"", "which does not hold Weir's rules for a sticky chain"}},
	"delete a cluster IP of the checks":     {{"", "set cluster-ips lacks cluster IP 10.96.0.10"}},
}

func TestKernelReadBackNamesTampering(t *testing.T) {
	for _, tm := range tamperings {
		t.Run(tm.name, func(t *testing.T) {
			topo, b := newCluster(t, Options{})
			p, _ := tamperPlan()
			mustSync(t, b, p, backends.FullSync())
			wantNoDivergence(t, "before tampering", b, p)
			runNft(t, topo.Node, tm.nft...)
			if tm.plant != nil {
				tm.plant(t, topo.Node.Fd())
			}
			divs := divergences(t, b, p)
			expected, ok := readBackTamperings[tm.name]
			if !ok {
				t.Fatalf("no expectation for tampering %q", tm.name)
			}
			for _, want := range expected {
				if want.field != "" && !hasDivergence(divs, "web", want.field) {
					t.Errorf("no %s divergence named for web; got:\n%s", want.field, formatDivergences(divs))
				}
				if want.text != "" && !hasAnomaly(divs, want.text) {
					t.Errorf("no anomaly %q; got:\n%s", want.text, formatDivergences(divs))
				}
			}
			mustSync(t, b, p, backends.FullSync())
			wantNoDivergence(t, "after the repairing full sync", b, p)
		})
	}
}

// TestKernelReadBackNamesForeignObjects plants objects that block nothing:
// ReadBack names each.
func TestKernelReadBackNamesForeignObjects(t *testing.T) {
	topo, b := newCluster(t, Options{})
	p, _ := tamperPlan()
	mustSync(t, b, p, backends.FullSync())
	runNft(t, topo.Node,
		"add set ip weir visitors { type ipv4_addr; }",
		"add rule ip weir services ip daddr 10.96.0.99 drop",
		"add element ip weir service-ips { 10.96.0.99 . tcp . 80 : goto pick-ip-3 }",
		"add element ip weir no-endpoint-ips { 10.96.0.98 . tcp . 80 }")
	divs := divergences(t, b, p)
	for _, text := range []string{
		"set visitors is not Weir's",
		"chain services holds a rule Weir did not write: payload, cmp, drop",
		"cluster IP 10.96.0.99:80/TCP has no buckets in endpoints-3",
	} {
		if !hasAnomaly(divs, text) {
			t.Errorf("no anomaly %q; got:\n%s", text, formatDivergences(divs))
		}
	}
	planted := backends.Destination{Kind: backends.DestCluster, Addr: netip.MustParseAddr("10.96.0.98"), Protocol: plan.TCP, Port: 80}
	found := false
	for _, d := range divs {
		found = found || (d.Destination == planted && d.Field == "destination" && d.Want == "absent")
	}
	if !found {
		t.Errorf("the planted refusal of %s is not named; got:\n%s", planted, formatDivergences(divs))
	}
}

// TestKernelReadBackMissingBuckets deletes one bucket of web's pool over
// netlink (the nft tool cannot type the map's keys).
func TestKernelReadBackMissingBuckets(t *testing.T) {
	topo, b := newCluster(t, Options{})
	p, web := tamperPlan()
	mustSync(t, b, p, backends.FullSync())
	entry := ipKey(vip, web.Key.Protocol, web.Port)
	conn, err := nftables.New(nftables.WithNetNSFd(topo.Node.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	set := &nftables.Set{Table: b.tables[0].layout.table, Name: mapID{lane: laneIP, weight: 3}.name()}
	if err := conn.SetDeleteElements(set, []nftables.SetElement{{Key: bucketKey(entry, 1)}}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("delete bucket 1 of web: %v", err)
	}
	divs := divergences(t, b, p)
	if !hasDivergence(divs, "web", "endpoints") || !hasAnomaly(divs, "lacks buckets [1] of endpoints-3") {
		t.Errorf("the missing bucket is not named; got:\n%s", formatDivergences(divs))
	}
}
