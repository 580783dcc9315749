package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/moby/ipvs"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// localLB is an externalTrafficPolicy Local load balancer with one local
// endpoint and one elsewhere.
func localLB() *plan.Service {
	s := service("lb", plan.TCP, 80, 30080, []string{"10.96.0.10"}, localEP("10.244.0.11", 8080), ep("10.244.1.12", 8080, 1))
	s.ExternalLocal = true
	s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	return s
}

func TestShortCircuitVirtualServers(t *testing.T) {
	st := desiredService(localLB(), nodeIPs, "rr", markBase)
	want := `FWM 65536 IPv4: rr 10.244.0.11:8080 w1 10.244.1.12:8080 w1
TCP 10.96.0.10:80: rr 10.244.0.11:8080 w1 10.244.1.12:8080 w1
TCP 172.30.0.1:30080: rr 10.244.0.11:8080 w1
TCP 198.51.100.5:80: rr 10.244.0.11:8080 w1`
	if got := describe(st); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	var rules []string
	for _, r := range st.marks {
		rules = append(rules, fmt.Sprintf("%s:%d %#x", r.addr, r.port, r.mark))
	}
	if got := strings.Join(rules, " "); got != "172.30.0.1:30080 0x10000 198.51.100.5:80 0x10000" {
		t.Errorf("mark rules %q", got)
	}
	// Both policies Local: the node's and the pods' traffic still goes to
	// the cluster's endpoints, as in kube-proxy's other modes.
	both := localLB()
	both.InternalLocal = true
	if st := desiredService(both, nodeIPs, "rr", markBase); !needsMark(both) || st.servers[markKey(markBase, 4)] == nil {
		t.Errorf("a service Local in both policies short-circuits to the cluster's endpoints; got\n%s", describe(st))
	}
	// No cluster endpoint of the family takes connections: no short circuit.
	idle := localLB()
	idle.Endpoints = []plan.Endpoint{ep("10.244.1.12", 8080, 0)}
	if st := desiredService(idle, nodeIPs, "rr", markBase); len(st.marks) != 0 || st.servers[markKey(markBase, 4)] != nil {
		t.Errorf("no endpoint takes connections: got marks %v, servers\n%s", st.marks, describe(st))
	}
}

func TestMarksAllocation(t *testing.T) {
	m := newMarks()
	a, b := plan.Key{Name: "a"}, plan.Key{Name: "b"}
	if got := m.forService(a, localLB()); got != markBase {
		t.Fatalf("first mark %#x, want %#x", got, markBase)
	}
	if got := m.forService(b, localLB()); got != markBase+1 {
		t.Fatalf("second mark %#x", got)
	}
	if got := m.forService(a, localLB()); got != markBase {
		t.Errorf("a's mark moved to %#x", got)
	}
	if got := m.forService(a, nil); got != 0 {
		t.Errorf("deleted service: mark %#x", got)
	}
	if got := m.forService(plan.Key{Name: "c"}, localLB()); got != markBase {
		t.Errorf("freed mark not reused: %#x", got)
	}
	plain := service("plain", plan.TCP, 80, 30080, []string{"10.96.0.1"})
	if got := m.forService(plan.Key{Name: "d"}, plain); got != 0 {
		t.Errorf("Cluster policy service got mark %#x", got)
	}
}

func TestMarkServiceRoundTrip(t *testing.T) {
	k := markKey(markBase+7, 6)
	s := toService(k, newVirtualServer("sh", 30))
	if s.FWMark != markBase+7 || s.AddressFamily != unix.AF_INET6 {
		t.Fatalf("toService: %+v", s)
	}
	got, vs, ok := fromService(s)
	if !ok || got != k || vs.persistence != 30 || vs.scheduler != "sh" {
		t.Errorf("fromService: %v %v %v", got, vs, ok)
	}
	if _, _, ok := fromService(&ipvs.Service{FWMark: 7, AddressFamily: unix.AF_INET}); ok {
		t.Error("a mark outside Weir's range was taken for Weir's")
	}
}

func TestRenderMangle(t *testing.T) {
	rules := []markRule{
		{addr: netip.MustParseAddr("198.51.100.5"), proto: plan.TCP, port: 80, mark: markBase},
		{addr: netip.MustParseAddr("fd00::5"), proto: plan.UDP, port: 53, mark: markBase + 1},
	}
	o := backends.Common{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	got := renderMangle(4, &o, plan.Node{}, rules)
	want := `*mangle
:WEIR-IPVS-MARK-PODS - [0:0]
:WEIR-IPVS-MARK-NODE - [0:0]
:WEIR-IPVS-SHORT-CIRCUIT - [0:0]
:WEIR-IPVS-NODE-FIREWALL - [0:0]
-A WEIR-IPVS-NODE-FIREWALL -m conntrack --ctstate NEW -m set --match-set WEIR-IPVS-FIREWALL dst,dst -m set ! --match-set WEIR-IPVS-SOURCE-RANGES dst,dst,src -j DROP
-A WEIR-IPVS-MARK-PODS -s 10.244.0.0/16 -m set --match-set WEIR-IPVS-EXTERNAL-LOCAL dst,dst -j WEIR-IPVS-SHORT-CIRCUIT
-A WEIR-IPVS-MARK-NODE -m set --match-set WEIR-IPVS-EXTERNAL-LOCAL dst,dst -j WEIR-IPVS-SHORT-CIRCUIT
-A WEIR-IPVS-SHORT-CIRCUIT -d 198.51.100.5/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000/0xffffffff
COMMIT
`
	if got != want {
		t.Errorf("IPv4 mangle:\n%s\nwant\n%s", got, want)
	}
	got6 := renderMangle(6, &o, plan.Node{}, rules)
	if strings.Contains(got6, "-A WEIR-IPVS-MARK-PODS") || !strings.Contains(got6, "-A WEIR-IPVS-SHORT-CIRCUIT -d fd00::5/128 -p udp -m udp --dport 53 -j MARK --set-xmark 0x10001/0xffffffff\n") {
		t.Errorf("IPv6 mangle (no IPv6 pod range, one UDP rule):\n%s", got6)
	}
}

func TestFilterEntries(t *testing.T) {
	lb := localLB()
	lb.Endpoints = []plan.Endpoint{ep("10.244.1.12", 8080, 1)} // none local
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("::ffff:172.30.0.0/120"), netip.MustParsePrefix("fd00::/64")}
	st := desiredService(lb, nodeIPs[:1], "rr", 0)
	want := `WEIR-IPVS-CLUSTER-IP 10.96.0.10,TCP:80
WEIR-IPVS-DROP 172.30.0.1,TCP:30080
WEIR-IPVS-DROP 198.51.100.5,TCP:80
WEIR-IPVS-EXTERNAL 172.30.0.1,TCP:30080
WEIR-IPVS-EXTERNAL 198.51.100.5,TCP:80
WEIR-IPVS-EXTERNAL-LOCAL 172.30.0.1,TCP:30080
WEIR-IPVS-EXTERNAL-LOCAL 198.51.100.5,TCP:80
WEIR-IPVS-FIREWALL 198.51.100.5,TCP:80
WEIR-IPVS-HAIRPIN 10.244.1.12,TCP:8080,10.244.1.12
WEIR-IPVS-SOURCE-RANGES 198.51.100.5,TCP:80,10.244.0.0/24
WEIR-IPVS-SOURCE-RANGES 198.51.100.5,TCP:80,172.30.0.0/24`
	if got := entryLines(masqEntries(lb, st, plan.Node{})); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// A range holds the node's IP: the load-balancer IP, the source of the
	// node's own connections to it, is allowed too.
	node := plan.Node{Addresses: []netip.Addr{netip.MustParseAddr("172.30.0.1")}}
	want += "\nWEIR-IPVS-SOURCE-RANGES 198.51.100.5,TCP:80,198.51.100.5/32"
	if got := entryLines(masqEntries(lb, st, node)); got != want {
		t.Errorf("node in a range: got\n%s\nwant\n%s", got, want)
	}
	// A /0 of the family allows everything: no firewall entries.
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	for _, e := range masqEntries(lb, st, node) {
		if e.set == setFirewall || e.set == setSourceRanges {
			t.Errorf("0.0.0.0/0 allowed: unexpected %s", e)
		}
	}
	// No endpoint at all: IPVS refuses by itself, nothing is dropped.
	lb.Endpoints = nil
	st = desiredService(lb, nodeIPs[:1], "rr", 0)
	for _, e := range masqEntries(lb, st, plan.Node{}) {
		if e.set == setDrop {
			t.Errorf("no endpoints: unexpected %s", e)
		}
	}
}
