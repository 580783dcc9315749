package conntrack

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// svc builds a service port with the given protocol and endpoints, each
// "address:port" with weight 1, or "address:port/0" drained.
func svc(proto plan.Protocol, endpoints ...string) *plan.Service {
	s := &plan.Service{
		Key:             plan.Key{Namespace: "ns", Name: "dns", Port: "dns", Protocol: proto},
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Port:            53,
		NodePort:        30053,
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.1")},
	}
	for _, e := range endpoints {
		ap, weight, drained := strings.Cut(e, "/")
		w := uint32(1)
		if drained && weight == "0" {
			w = 0
		}
		a := netip.MustParseAddrPort(ap)
		s.Endpoints = append(s.Endpoints, plan.Endpoint{Address: a.Addr(), Port: a.Port(), Ready: true, Serving: true, Weight: w})
	}
	return s
}

// flows parses "UDP 10.96.0.10:53 -> 10.244.0.5" and "UDP *:30053" lines,
// the format of Flow.String.
func flows(t *testing.T, lines ...string) []Flow {
	t.Helper()
	var out []Flow
	for _, l := range lines {
		head, ep, hasEP := strings.Cut(l, " -> ")
		proto, dest, _ := strings.Cut(head, " ")
		f := Flow{Protocol: plan.Protocol(proto)}
		if port, ok := strings.CutPrefix(dest, "*:"); ok {
			p, err := strconv.ParseUint(port, 10, 16)
			if err != nil {
				t.Fatal(err)
			}
			f.Dest = netip.AddrPortFrom(netip.Addr{}, uint16(p))
		} else {
			f.Dest = netip.MustParseAddrPort(dest)
		}
		if hasEP {
			f.Endpoint = netip.MustParseAddr(ep)
		}
		if f.String() != l {
			t.Fatalf("flow %q formats as %q", l, f)
		}
		out = append(out, f)
	}
	return out
}

func TestStaleFlows(t *testing.T) {
	const (
		a  = "10.244.0.5:5353"
		b  = "10.244.0.6:5353"
		a6 = "[fd00:244::5]:5353"
	)
	// every is the destinations of one endpoint of each family.
	every := func(proto, ep4, ep6 string) []string {
		var out []string
		if ep4 != "" {
			for _, d := range []string{"*:30053", "10.96.0.10:53", "192.0.2.1:53", "198.51.100.1:53"} {
				out = append(out, proto+" "+d+" -> "+ep4)
			}
		}
		if ep6 != "" {
			out = append(out, proto+" *:30053 -> "+ep6, proto+" [fd00:96::10]:53 -> "+ep6)
		}
		return out
	}
	rule2 := func(proto string) []string {
		return []string{proto + " *:30053", proto + " 10.96.0.10:53", proto + " 192.0.2.1:53",
			proto + " 198.51.100.1:53", proto + " [fd00:96::10]:53"}
	}
	cases := []struct {
		name     string
		old, cur *plan.Service
		want     []string
	}{
		{name: "nothing", old: nil, cur: nil},
		{name: "TCP endpoint removed", old: svc(plan.TCP, a, b), cur: svc(plan.TCP, a)},
		{name: "TCP first endpoint", old: svc(plan.TCP), cur: svc(plan.TCP, a)},
		{name: "unchanged", old: svc(plan.UDP, a, b), cur: svc(plan.UDP, a, b)},
		{name: "endpoint added", old: svc(plan.UDP, a), cur: svc(plan.UDP, a, b)},
		{name: "drained and readiness changes are not removals",
			old: svc(plan.UDP, a, b), cur: func() *plan.Service {
				s := svc(plan.UDP, a, b+"/0")
				s.Endpoints[0].Ready = false
				return s
			}()},
		{name: "endpoint removed", old: svc(plan.UDP, a, b, a6), cur: svc(plan.UDP, a),
			want: every("UDP", "10.244.0.6", "fd00:244::5")},
		{name: "endpoint changed port", old: svc(plan.UDP, a), cur: svc(plan.UDP, "10.244.0.5:5354"),
			want: every("UDP", "10.244.0.5", "")},
		{name: "SCTP endpoint removed", old: svc(plan.SCTP, a, b), cur: svc(plan.SCTP, b),
			want: every("SCTP", "10.244.0.5", "")},
		{name: "last endpoint removed", old: svc(plan.UDP, a), cur: svc(plan.UDP),
			want: every("UDP", "10.244.0.5", "")},
		{name: "service removed", old: svc(plan.UDP, a, a6), cur: nil,
			want: every("UDP", "10.244.0.5", "fd00:244::5")},
		{name: "new service", old: nil, cur: svc(plan.UDP, a), want: rule2("UDP")},
		{name: "new service without endpoints", old: nil, cur: svc(plan.UDP)},
		{name: "first endpoint", old: svc(plan.UDP), cur: svc(plan.UDP, a), want: rule2("UDP")},
		{name: "first SCTP endpoint", old: svc(plan.SCTP), cur: svc(plan.SCTP, a6), want: rule2("SCTP")},
		{name: "first undrained endpoint", old: svc(plan.UDP, a+"/0"), cur: svc(plan.UDP, a), want: rule2("UDP")},
		{name: "only drained endpoints", old: svc(plan.UDP), cur: svc(plan.UDP, a+"/0")},
		{name: "drained endpoint replaced", old: svc(plan.UDP, a+"/0"), cur: svc(plan.UDP, b),
			want: append(every("UDP", "10.244.0.5", ""), rule2("UDP")...)},
		{name: "addresses of old and new state, once each",
			old: func() *plan.Service {
				s := svc(plan.UDP, a, b)
				s.ExternalIPs = append(s.ExternalIPs, netip.MustParseAddr("10.96.0.10"))
				return s
			}(),
			cur: func() *plan.Service {
				s := svc(plan.UDP, b)
				s.ExternalIPs, s.LoadBalancerIPs, s.NodePort = []netip.Addr{netip.MustParseAddr("192.0.2.2")}, nil, 0
				return s
			}(),
			want: append(every("UDP", "10.244.0.5", ""), "UDP 192.0.2.2:53 -> 10.244.0.5")},
		{name: "no node port, mapped addresses",
			old: &plan.Service{Key: plan.Key{Protocol: plan.UDP}, Port: 53,
				ClusterIPs: []netip.Addr{netip.MustParseAddr("::ffff:10.96.0.10")},
				Endpoints:  []plan.Endpoint{{Address: netip.MustParseAddr("::ffff:10.244.0.5"), Port: 53, Weight: 1}}},
			cur:  &plan.Service{Key: plan.Key{Protocol: plan.UDP}, Port: 53},
			want: []string{"UDP 10.96.0.10:53 -> 10.244.0.5"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := flows(t, c.want...)
			slices.SortFunc(want, compareFlows)
			got := StaleFlows(c.old, c.cur)
			if !slices.Equal(got, want) {
				t.Errorf("StaleFlows:\n got %s\nwant %s", describeAll(got), describeAll(want))
			}
			for _, f := range got {
				if err := f.validate(); err != nil {
					t.Errorf("invalid flow: %v", err)
				}
			}
		})
	}
}

func describeAll(fs []Flow) string {
	var s []string
	for _, f := range fs {
		s = append(s, f.String())
	}
	return "[" + strings.Join(s, "; ") + "]"
}
