package backends

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

func ep(addr string, weight uint32, cluster, local bool) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: 8080, Weight: weight, ForCluster: cluster, ForLocal: local}
}

func viewPlan() *plan.Plan {
	web := &plan.Service{
		Key:             plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP},
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")},
		Port:            80,
		NodePort:        30080,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		ExternalLocal:   true,
		Affinity:        &plan.Affinity{TimeoutSeconds: 0},
		Endpoints:       []plan.Endpoint{ep("10.0.0.1", 1, true, true), ep("10.0.0.2", 3, true, false), ep("10.0.0.3", 0, true, false)},
	}
	empty := &plan.Service{Key: plan.Key{Namespace: "default", Name: "empty", Protocol: plan.UDP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Port: 53}
	return &plan.Plan{Services: map[plan.Key]*plan.Service{web.Key: web, empty.Key: empty}}
}

func TestExpect(t *testing.T) {
	v, owners := Expect(viewPlan(), ExpectOptions{NodePortFamilies: []int{4}})
	tcp := func(kind DestinationKind, addr string, port uint16) Destination {
		return Destination{kind, netip.MustParseAddr(addr), plan.TCP, port}
	}
	cases := []struct {
		d    Destination
		want string
	}{
		{tcp(DestCluster, "10.96.0.10", 80), "forward 10.0.0.1:8080*1 10.0.0.2:8080*3 affinity 1 short none ranges everyone"},
		{tcp(DestCluster, "fd00::10", 80), "reject none affinity 0 short none ranges everyone"},
		{tcp(DestExternal, "192.0.2.10", 80), "forward 10.0.0.1:8080*1 affinity 1 short 10.0.0.1:8080*1 10.0.0.2:8080*3 ranges 198.51.100.0/24"},
		{tcp(DestNodePort, "0.0.0.0", 30080), "forward 10.0.0.1:8080*1 affinity 1 short 10.0.0.1:8080*1 10.0.0.2:8080*3 ranges everyone"},
		{Destination{DestCluster, netip.MustParseAddr("10.96.0.11"), plan.UDP, 53}, "reject none affinity 0 short none ranges everyone"},
	}
	if len(v.Destinations) != len(cases) {
		t.Errorf("got %d destinations, want %d: %v", len(v.Destinations), len(cases), v.Destinations)
	}
	for _, c := range cases {
		f, ok := v.Destinations[c.d]
		if !ok {
			t.Errorf("%s missing", c.d)
			continue
		}
		got := strings.Join([]string{f.Verdict.String(), formatWeights(f.Endpoints), "affinity", fmt.Sprint(f.AffinitySeconds),
			"short", formatWeights(f.ShortCircuit), "ranges", formatRanges(f.Allowed)}, " ")
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.d, got, c.want)
		}
		if owners[c.d].Name == "" {
			t.Errorf("%s has no owner", c.d)
		}
	}
}

func TestCompareNamesServiceAndField(t *testing.T) {
	want, owners := Expect(viewPlan(), ExpectOptions{NodePortFamilies: []int{4}})
	if d := Compare(want, owners, want); len(d) != 0 {
		t.Fatalf("a view differs from itself: %v", d)
	}
	got := &View{Destinations: map[Destination]Forwarding{}}
	for d, f := range want.Destinations {
		got.Destinations[d] = f
	}
	cip := Destination{DestCluster, netip.MustParseAddr("10.96.0.10"), plan.TCP, 80}
	f := got.Destinations[cip]
	// Shares within the tolerance are the same; a lost endpoint is not.
	f.Endpoints = map[netip.AddrPort]uint32{netip.MustParseAddrPort("10.0.0.1:8080"): 1000, netip.MustParseAddrPort("10.0.0.2:8080"): 3001}
	got.Destinations[cip] = f
	if d := Compare(want, owners, got); len(d) != 0 {
		t.Fatalf("approximate weights diverge: %v", d)
	}
	f.Endpoints = map[netip.AddrPort]uint32{netip.MustParseAddrPort("10.0.0.1:8080"): 1}
	got.Destinations[cip] = f
	extra := Destination{DestNodePort, netip.IPv4Unspecified(), plan.UDP, 31000}
	got.Destinations[extra] = Forwarding{Verdict: VerdictReject}
	delete(got.Destinations, Destination{DestCluster, netip.MustParseAddr("10.96.0.11"), plan.UDP, 53})
	got.Anomalies = []string{"map endpoints-4 is missing"}
	var lines []string
	for _, d := range Compare(want, owners, got) {
		lines = append(lines, d.String())
	}
	wantLines := []string{
		"default/web:http/TCP (cluster IP 10.96.0.10:80/TCP): endpoints: want 10.0.0.1:8080*1 10.0.0.2:8080*3, got 10.0.0.1:8080*1",
		"default/empty:/UDP (cluster IP 10.96.0.11:53/UDP): destination: want present (reject), got missing",
		"no service (node port 0.0.0.0:31000/UDP): destination: want absent, got present (reject)",
		"anomaly: map endpoints-4 is missing",
	}
	if strings.Join(lines, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}
}

func TestCompareTakesASlashZeroRangeForEveryone(t *testing.T) {
	d := Destination{DestExternal, netip.MustParseAddr("192.0.2.10"), plan.TCP, 80}
	want := &View{Destinations: map[Destination]Forwarding{d: {Verdict: VerdictReject, Allowed: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}}
	got := &View{Destinations: map[Destination]Forwarding{d: {Verdict: VerdictReject}}}
	if div := Compare(want, nil, got); len(div) != 0 {
		t.Errorf("0.0.0.0/0 against no ranges: %v", div)
	}
	got.Destinations[d] = Forwarding{Verdict: VerdictReject, Allowed: []netip.Prefix{}}
	if div := Compare(want, nil, got); len(div) != 1 || div[0].Field != "source ranges" {
		t.Errorf("0.0.0.0/0 against nobody: %v", div)
	}
}

func TestCompareSourceRangesBySources(t *testing.T) {
	d := Destination{DestExternal, netip.MustParseAddr("192.0.2.10"), plan.TCP, 80}
	ranges := func(s ...string) []netip.Prefix {
		out := []netip.Prefix{}
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	want := &View{Destinations: map[Destination]Forwarding{d: {Verdict: VerdictReject, Allowed: ranges("10.0.0.0/8", "10.1.0.0/16", "10.0.0.0/8")}}}
	got := &View{Destinations: map[Destination]Forwarding{d: {Verdict: VerdictReject, Allowed: ranges("10.0.0.0/8")}}}
	if div := Compare(want, nil, got); len(div) != 0 {
		t.Errorf("a range inside another, and a duplicate, against the covering range: %v", div)
	}
	got.Destinations[d] = Forwarding{Verdict: VerdictReject, Allowed: ranges("10.1.0.0/16")}
	if div := Compare(want, nil, got); len(div) != 1 || div[0].Field != "source ranges" {
		t.Errorf("against the inner range only: %v", div)
	}
}
