package ipvs

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// modelled returns a backend that believes it has synced p on a node
// with nodeIPs, and the snapshot a kernel holding exactly what it would
// program reads back as: the model of ReadBack's input.
func modelled(t *testing.T, o backends.Common, p *plan.Plan) (*Backend, *snapshot) {
	t.Helper()
	b := &Backend{opts: Options{Common: o, Interface: DefaultInterface, Scheduler: DefaultScheduler}, log: slog.Default(),
		marks: newMarks(), synced: true, nodePorts: nodeIPs, masq: &masqLayer{}}
	want := b.desiredAll(p)
	s := &snapshot{iface: DefaultInterface, onLink: map[netip.Addr]bool{}, nodePorts: nodeIPs, servers: want,
		sets: map[string]map[setEntry]bool{}, rules: map[int]*familyRules{}, bad: &anomalies{}}
	for a := range b.addrRefs {
		s.onLink[a] = true
	}
	for _, set := range allSets() {
		s.sets[set.name] = map[setEntry]bool{}
	}
	for _, f := range []int{4, 6} {
		s.rules[f] = &familyRules{filterOK: true, nodeFirewallOK: true, shortCircuitOK: true, marks: map[vsKey]uint32{}}
	}
	for _, st := range b.services {
		for _, e := range st.entries {
			s.sets[e.set][e] = true
		}
		for _, r := range st.marks {
			s.rules[familyOf(r.addr)].marks[vsKey{addr: r.addr, proto: r.proto, port: r.port}] = r.mark
		}
	}
	return b, s
}

// readBackPlan has a service of each kind the backend handles.
func readBackPlan() *plan.Plan {
	dual := service("dual", plan.TCP, 80, 30080, []string{"10.96.0.10", "fd00:10:96::10"},
		ep("10.244.0.11", 8080, 1), ep("fd00:10:244::11", 8080, 1))
	single := service("single", plan.UDP, 53, 30053, []string{"10.96.0.11"}, ep("10.244.0.12", 53, 1))
	weighted := service("weighted", plan.TCP, 80, 0, []string{"10.96.0.12"}, ep("10.244.0.11", 8080, 100), ep("10.244.0.12", 8080, 300), ep("10.244.0.13", 8080, 0))
	weighted.Scheduler = plan.SchedulerWeightedRoundRobin
	sticky := service("sticky", plan.TCP, 443, 0, []string{"10.96.0.13"}, ep("10.244.0.12", 8443, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	lb := localLB()
	lb.ClusterIPs, lb.NodePort = []netip.Addr{netip.MustParseAddr("10.96.0.17")}, 30084
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("fd00:203::/48")}
	remote := service("remote", plan.TCP, 80, 30082, []string{"10.96.0.14"}, ep("10.244.1.12", 8080, 1))
	remote.ExternalLocal = true
	remote.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	everyone := service("everyone", plan.TCP, 80, 0, []string{"10.96.0.15"}, ep("10.244.0.11", 8080, 1))
	everyone.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.6")}
	everyone.SourceRanges = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	empty := service("empty", plan.TCP, 80, 30083, []string{"10.96.0.16"})
	return testPlanOf(dual, single, weighted, sticky, lb, remote, everyone, empty)
}

func testPlanOf(svcs ...*plan.Service) *plan.Plan {
	p := &plan.Plan{Node: plan.Node{Name: "node"}, Services: map[plan.Key]*plan.Service{}}
	for _, s := range svcs {
		p.Services[s.Key] = s
	}
	return p
}

func divergences(d []backends.Divergence) string {
	var lines []string
	for _, x := range d {
		lines = append(lines, x.String())
	}
	return strings.Join(lines, "\n")
}

// TestReadBackModel reads back what the backend programs for a varied
// plan and finds exactly the plan's view.
func TestReadBackModel(t *testing.T) {
	p := readBackPlan()
	b, s := modelled(t, backends.Common{}, p)
	want, owners := b.Expected(p)
	got := s.view()
	if d := backends.Compare(want, owners, got); len(d) > 0 {
		t.Errorf("the model of a committed plan diverges:\n%s", divergences(d))
	}
	if _, ok := want.Destinations[backends.Destination{Kind: backends.DestNodePort, Addr: netip.IPv6Unspecified(), Protocol: plan.UDP, Port: 30053}]; ok {
		t.Error("Expected has the IPv6 node port of a single-stack IPv4 service, which IPVS does not serve")
	}
}

// TestReadBackModelNamesDamage damages the model as an operator might and
// checks that Compare names the service, field or anomaly.
func TestReadBackModelNamesDamage(t *testing.T) {
	vs := func(a string, port uint16) vsKey {
		return vsKey{addr: netip.MustParseAddr(a), proto: plan.TCP, port: port}
	}
	cases := []struct {
		name   string
		damage func(s *snapshot)
		want   string
	}{
		{"real server gone", func(s *snapshot) {
			delete(s.servers[vs("10.96.0.12", 80)].reals, netip.MustParseAddrPort("10.244.0.11:8080"))
		},
			"default/weighted:p/TCP (cluster IP 10.96.0.12:80/TCP): endpoints: want 10.244.0.11:8080*100 10.244.0.12:8080*300, got 10.244.0.12:8080*3"},
		{"weight changed", func(s *snapshot) {
			s.servers[vs("10.96.0.12", 80)].reals[netip.MustParseAddrPort("10.244.0.11:8080")] = 3
		},
			"endpoints: want 10.244.0.11:8080*100 10.244.0.12:8080*300, got 10.244.0.11:8080*3 10.244.0.12:8080*3"},
		{"weights under rr", func(s *snapshot) { s.servers[vs("10.96.0.12", 80)].scheduler = "rr" },
			"got 10.244.0.11:8080*1 10.244.0.12:8080*1"},
		{"not NAT", func(s *snapshot) {
			s.servers[vs("10.96.0.10", 80)].reals[netip.MustParseAddrPort("10.244.0.11:8080")] = notNAT
		},
			"anomaly: real servers that do not forward by NAT (their connections do not reach them): TCP 10.96.0.10:80 -> 10.244.0.11:8080"},
		{"virtual server gone", func(s *snapshot) { delete(s.servers, vs("10.96.0.13", 443)) },
			"default/sticky:p/TCP (cluster IP 10.96.0.13:443/TCP): destination: want present (forward), got missing"},
		{"affinity lost", func(s *snapshot) { s.servers[vs("10.96.0.13", 443)].persistence = 0 },
			"default/sticky:p/TCP (cluster IP 10.96.0.13:443/TCP): affinity: want 600, got 0"},
		{"address gone", func(s *snapshot) { delete(s.onLink, netip.MustParseAddr("10.96.0.13")) },
			"anomaly: virtual servers in Weir's sets whose address is not on weir-ipvs0 (the node does not accept their connections): TCP 10.96.0.13:443"},
		{"node port on one address", func(s *snapshot) { delete(s.servers, vs("172.30.0.1", 30080)) },
			"default/dual:p/TCP (node port 0.0.0.0:30080/TCP): destination: want present (forward), got missing"},
		{"drop set flushed", func(s *snapshot) { s.sets[setDrop] = map[setEntry]bool{} },
			"default/remote:p/TCP (external IP 192.0.2.10:80/TCP): verdict: want drop, got reject"},
		{"filter broken", func(s *snapshot) { s.rules[4].filterOK = false },
			"default/lb:p/TCP (external IP 198.51.100.5:80/TCP): source ranges: want 203.0.113.0/24, got everyone"},
		{"node firewall broken", func(s *snapshot) { s.rules[4].nodeFirewallOK = false },
			"default/lb:p/TCP (external IP 198.51.100.5:80/TCP): source ranges: want 203.0.113.0/24, got everyone"},
		{"source range gone", func(s *snapshot) { s.sets[setSourceRanges] = map[setEntry]bool{} },
			"source ranges: want 203.0.113.0/24, got nobody"},
		{"mark rule gone", func(s *snapshot) { s.rules[4].marks = map[vsKey]uint32{} },
			"default/lb:p/TCP (external IP 198.51.100.5:80/TCP): short-circuit: want 10.244.0.11:8080*1 10.244.1.12:8080*1, got none"},
		{"cluster set flushed", func(s *snapshot) { s.sets[setClusterIP] = map[setEntry]bool{} },
			"anomaly: virtual servers on weir-ipvs0 in neither WEIR-IPVS-CLUSTER-IP nor WEIR-IPVS-EXTERNAL"},
		{"hairpin entry gone", func(s *snapshot) {
			delete(s.sets[setHairpin], setEntry{set: setHairpin, addr: netip.MustParseAddr("10.244.0.12"), proto: plan.UDP, port: 53, addr2: netip.MustParseAddr("10.244.0.12")})
		}, "anomaly: real servers missing from WEIR-IPVS-HAIRPIN (an endpoint reaching itself through the service is not masqueraded): WEIR-IPVS-HAIRPIN 10.244.0.12,UDP:53,10.244.0.12"},
		{"stray entry", func(s *snapshot) {
			s.sets[setExternal][setEntry{set: setExternal, addr: netip.MustParseAddr("192.0.2.99"), proto: plan.TCP, port: 1}] = true
		}, "anomaly: ipset entries naming no virtual server of Weir's: WEIR-IPVS-EXTERNAL 192.0.2.99,TCP:1"},
		{"stray virtual server", func(s *snapshot) { s.servers[vs("10.96.0.10", 81)] = newVirtualServer("rr", 0) },
			"no service (cluster IP 10.96.0.10:81/TCP): destination: want absent, got present (reject)"},
		{"foreign virtual server", func(s *snapshot) { s.servers[vs("10.200.0.1", 80)] = newVirtualServer("rr", 0) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := readBackPlan()
			b, s := modelled(t, backends.Common{}, p)
			c.damage(s)
			want, owners := b.Expected(p)
			got := divergences(backends.Compare(want, owners, s.view()))
			if c.want == "" && got != "" || !strings.Contains(got, c.want) {
				t.Errorf("got\n%s\nwant a line with %q", got, c.want)
			}
		})
	}
}

// savedFrom turns iptables-restore input into what iptables-save shows of
// it, with the jumps of the built-in chains (all but those in skip).
func savedFrom(text []byte, skip ...jump) map[string]savedTable {
	out := map[string]savedTable{}
	for table, t := range splitTables(text) {
		out[table] = parseSave(t)
	}
	for _, j := range jumps {
		if !slices.Contains(skip, j) {
			t := out[j.table]
			t.rules[j.from] = append(t.rules[j.from], fmt.Sprintf("-m comment --comment %q -j %s", j.comment, j.to))
		}
	}
	return out
}

func TestCheckRules(t *testing.T) {
	o := &backends.Common{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	marks := []markRule{{addr: netip.MustParseAddr("198.51.100.5"), proto: plan.TCP, port: 80, mark: markBase},
		{addr: netip.MustParseAddr("172.30.0.1"), proto: plan.SCTP, port: 30080, mark: markBase + 1}}
	want := splitTables(renderRules(4, o, plan.Node{}, nil))

	bad := &anomalies{}
	r := checkRules(4, savedFrom(renderRules(4, o, plan.Node{}, marks)), want, nil, bad)
	if len(bad.lines()) > 0 || !r.filterOK || !r.nodeFirewallOK || !r.shortCircuitOK {
		t.Errorf("intact rules: anomalies %q, filter %v, node firewall %v, short circuit %v", bad.lines(), r.filterOK, r.nodeFirewallOK, r.shortCircuitOK)
	}
	wantMarks := map[vsKey]uint32{
		{addr: netip.MustParseAddr("198.51.100.5"), proto: plan.TCP, port: 80}:   markBase,
		{addr: netip.MustParseAddr("172.30.0.1"), proto: plan.SCTP, port: 30080}: markBase + 1,
	}
	if !maps.Equal(r.marks, wantMarks) {
		t.Errorf("marks: got %v, want %v", r.marks, wantMarks)
	}

	got := savedFrom(renderRules(4, o, plan.Node{}, marks), jumps[3])
	nat := got["nat"]
	nat.rules[chainMarkMasq] = nil
	delete(got["mangle"].chains, chainMarkNode)
	bad = &anomalies{}
	r = checkRules(4, got, want, nil, bad)
	wantLines := []string{
		`IPv4 nat chain WEIR-IPVS-MARK-MASQ differs from what Weir writes: 0 rules, want 1; rule 1 is "", want "-j MARK --set-xmark 0x4000/0x4000"`,
		"IPv4 mangle chain WEIR-IPVS-MARK-NODE is missing",
		"IPv4 filter chain INPUT does not jump to WEIR-IPVS-FILTER",
	}
	if !slices.Equal(bad.lines(), wantLines) || r.filterOK || r.shortCircuitOK {
		t.Errorf("broken rules: anomalies\n%s\nwant\n%s\nfilter %v, short circuit %v", strings.Join(bad.lines(), "\n"), strings.Join(wantLines, "\n"), r.filterOK, r.shortCircuitOK)
	}

	// Without the jump checking the node's own connections, the ranges
	// do not hold, whatever INPUT does.
	nodeJump := jumps[slices.IndexFunc(jumps, func(j jump) bool { return j.to == chainNodeFirewall })]
	bad = &anomalies{}
	r = checkRules(4, savedFrom(renderRules(4, o, plan.Node{}, marks), nodeJump), want, nil, bad)
	if r.nodeFirewallOK || !r.filterOK || !slices.Equal(bad.lines(), []string{"IPv4 mangle chain OUTPUT does not jump to WEIR-IPVS-NODE-FIREWALL"}) {
		t.Errorf("no jump to %s: node firewall %v, filter %v, anomalies %q", chainNodeFirewall, r.nodeFirewallOK, r.filterOK, bad.lines())
	}
}

func TestParseMarkRule(t *testing.T) {
	for _, tc := range []struct {
		rule string
		want markRule
		ok   bool
	}{
		{"-d 198.51.100.5/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000/0xffffffff",
			markRule{addr: netip.MustParseAddr("198.51.100.5"), proto: plan.TCP, port: 80, mark: 0x10000}, true},
		{"-d fd00::5/128 -p sctp -m sctp --dport 3868 -j MARK --set-xmark 0x1ffff/0xffffffff",
			markRule{addr: netip.MustParseAddr("fd00::5"), proto: plan.SCTP, port: 3868, mark: 0x1ffff}, true},
		{"-d 198.51.100.0/24 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000/0xffffffff", markRule{}, false},
		{"-d 198.51.100.5/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000/0xffff", markRule{}, false},
		{"-d 198.51.100.5/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x4000/0xffffffff", markRule{}, false},
		{"-j ACCEPT", markRule{}, false},
	} {
		got, ok := parseMarkRule(tc.rule)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%q: got %+v %v, want %+v %v", tc.rule, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNodePortsCollapse(t *testing.T) {
	p := readBackPlan()
	b, s := modelled(t, backends.Common{}, p)
	// A second IPv4 node-port address, on which one node port is missing
	// and another forwards elsewhere.
	second := netip.MustParseAddr("172.30.0.9")
	s.nodePorts = append(s.nodePorts, second)
	for k, vs := range s.servers {
		if k.addr == nodeIPs[0] && k.port != 30082 {
			c := newVirtualServer(vs.scheduler, vs.persistence)
			maps.Copy(c.reals, vs.reals)
			s.servers[vsKey{addr: second, proto: k.proto, port: k.port}] = c
		}
	}
	s.servers[vsKey{addr: second, proto: plan.TCP, port: 30080}].reals = map[netip.AddrPort]int32{netip.MustParseAddrPort("10.244.0.13:8080"): 1}
	for _, set := range []string{setExternal, setExternalLocal, setDrop} {
		for e := range s.sets[set] {
			if e.addr == nodeIPs[0] {
				e.addr = second
				s.sets[set][e] = true
			}
		}
	}
	want, owners := b.Expected(p)
	got := divergences(backends.Compare(want, owners, s.view()))
	for _, line := range []string{
		"anomaly: node port 30082/TCP (IPv4) is not served on every node-port address: not on 172.30.0.9",
		"anomaly: node port 30080/TCP (IPv4) forwards differently on its addresses: 172.30.0.1 (forward 10.244.0.11:8080*1), but: 172.30.0.9 (forward 10.244.0.13:8080*1)",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("got\n%s\nwant a line %q", got, line)
		}
	}
}

func TestAnomalyLines(t *testing.T) {
	a := &anomalies{}
	a.add("chain missing", "")
	for i := range 5 {
		a.add("stray entries", fmt.Sprint(i))
	}
	a.add("stray entries", "0")
	want := []string{"chain missing", "stray entries: 0; 1; 2 and 2 more"}
	if got := a.lines(); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
