package iptables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

func TestRelativeWeights(t *testing.T) {
	a, b, c := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80"), netip.MustParseAddrPort("10.0.0.3:80")
	for _, tc := range []struct {
		shares map[netip.AddrPort]float64
		want   map[netip.AddrPort]uint32
	}{
		{map[netip.AddrPort]float64{a: 0.75, b: 0.25}, map[netip.AddrPort]uint32{a: 3, b: 1}},
		{map[netip.AddrPort]float64{a: 1.0 / 3, b: 1.0 / 3, c: 1.0 / 3}, map[netip.AddrPort]uint32{a: 1, b: 1, c: 1}},
		// As iptables-save prints kube-proxy's 1/3 (the kernel keeps 31 bits).
		{map[netip.AddrPort]float64{a: 0.33333333349, b: 0.66666666651 * 0.5, c: 0.66666666651 * 0.5}, map[netip.AddrPort]uint32{a: 1, b: 1, c: 1}},
		{map[netip.AddrPort]float64{a: 0.5, b: 0.5}, map[netip.AddrPort]uint32{a: 1, b: 1}},
		// No small weights give these shares: millionths.
		{map[netip.AddrPort]float64{a: 0.31415926, b: 0.68584074}, map[netip.AddrPort]uint32{a: 314159, b: 685841}},
	} {
		got := relativeWeights(tc.shares)
		if len(got) != len(tc.want) {
			t.Errorf("relativeWeights(%v) = %v, want %v", tc.shares, got, tc.want)
			continue
		}
		for ep, w := range tc.want {
			if got[ep] != w {
				t.Errorf("relativeWeights(%v) = %v, want %v", tc.shares, got, tc.want)
				break
			}
		}
	}
}

// TestReadFamilyOfKubeProxysLayout reads a nat and filter table written
// as kube-proxy writes them (as iptables-save prints them): a cluster IP
// over two endpoints with affinity, a node port, and a reject.
func TestReadFamilyOfKubeProxysLayout(t *testing.T) {
	nat := `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-EXT-A - [0:0]
:KUBE-SEP-1 - [0:0]
:KUBE-SEP-2 - [0:0]
:KUBE-SEP-ORPHAN - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "ns/a:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns/a:http" -m tcp --dport 30080 -j KUBE-EXT-A
-A KUBE-EXT-A -m comment --comment "masquerade traffic for ns/a:http external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-A -j KUBE-SVC-A
-A KUBE-SVC-A -m comment --comment "ns/a:http -> 10.244.0.1:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -j KUBE-SEP-1
-A KUBE-SVC-A -m comment --comment "ns/a:http -> 10.244.0.2:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-2 --mask 255.255.255.255 --rsource -j KUBE-SEP-2
-A KUBE-SVC-A -m comment --comment "ns/a:http -> 10.244.0.1:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-1
-A KUBE-SVC-A -m comment --comment "ns/a:http -> 10.244.0.2:8080" -j KUBE-SEP-2
-A KUBE-SEP-1 -s 10.244.0.1/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-1 -p tcp -m recent --set --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.0.1:8080
-A KUBE-SEP-2 -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-2 -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:8080
COMMIT
`
	filter := `*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.12/32 -p udp -m comment --comment "ns/b:dns has no endpoints" -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`
	v := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{}}
	readFamily(v, ipv4, parseSave([]byte(nat)), parseSave([]byte(filter)))
	eps := map[netip.AddrPort]uint32{netip.MustParseAddrPort("10.244.0.1:8080"): 1, netip.MustParseAddrPort("10.244.0.2:8080"): 1}
	want := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{
		{Kind: backends.DestCluster, Addr: netip.MustParseAddr("10.96.0.10"), Protocol: plan.TCP, Port: 80}: {Verdict: backends.VerdictForward, Endpoints: eps, AffinitySeconds: 10800},
		{Kind: backends.DestNodePort, Addr: netip.IPv4Unspecified(), Protocol: plan.TCP, Port: 30080}:       {Verdict: backends.VerdictForward, Endpoints: eps, AffinitySeconds: 10800},
		{Kind: backends.DestCluster, Addr: netip.MustParseAddr("10.96.0.12"), Protocol: plan.UDP, Port: 53}: {Verdict: backends.VerdictReject},
	}}
	for _, d := range backends.Compare(want, nil, &backends.View{Destinations: v.Destinations}) {
		t.Error(d)
	}
	anomalies := strings.Join(v.Anomalies, "\n")
	for _, a := range []string{
		"IPv4 nat chain KUBE-SEP-2 (for cluster IP 10.96.0.10:80/TCP) does not record clients for session affinity",
		"IPv4 nat chain KUBE-SEP-ORPHAN is used by no rule",
		"IPv4 filter chain KUBE-PROXY-FIREWALL is missing",
		"IPv4 filter chain INPUT has no jump to KUBE-NODEPORTS",
	} {
		if !strings.Contains(anomalies, a) {
			t.Errorf("anomalies do not say %q:\n%s", a, anomalies)
		}
	}
}

// TestReadFirewallAllowsTheNodeByAddress reads KUBE-FW chains as
// kube-proxy writes them when a source range holds the node's IP (the
// load-balancer IP allowed as a source), and one as Weir wrote them before
// it checked the node's own connections (--src-type LOCAL let them all
// through): that one is an anomaly, since the ranges do not hold.
func TestReadFirewallAllowsTheNodeByAddress(t *testing.T) {
	nat := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-FW-A - [0:0]
:KUBE-FW-B - [0:0]
:KUBE-EXT-A - [0:0]
:KUBE-EXT-B - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-1 - [0:0]
-A KUBE-SERVICES -d 198.51.100.5/32 -p tcp -m comment --comment "ns/a:https loadbalancer IP" -m tcp --dport 443 -j KUBE-FW-A
-A KUBE-SERVICES -d 198.51.100.6/32 -p tcp -m comment --comment "ns/b:https loadbalancer IP" -m tcp --dport 443 -j KUBE-FW-B
-A KUBE-FW-A -s 172.30.0.0/24 -m comment --comment "ns/a:https loadbalancer IP" -j KUBE-EXT-A
-A KUBE-FW-A -s 198.51.100.5/32 -m comment --comment "ns/a:https loadbalancer IP" -j KUBE-EXT-A
-A KUBE-FW-A -m comment --comment "other traffic to ns/a:https will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-FW-B -m comment --comment "ns/b:https loadbalancer IP" -m addrtype --src-type LOCAL -j KUBE-EXT-B
-A KUBE-FW-B -s 10.0.0.0/8 -m comment --comment "ns/b:https loadbalancer IP" -j KUBE-EXT-B
-A KUBE-EXT-A -j KUBE-SVC-A
-A KUBE-EXT-B -j KUBE-SVC-A
-A KUBE-SVC-A -j KUBE-SEP-1
-A KUBE-SEP-1 -p tcp -m tcp -j DNAT --to-destination 10.244.0.1:8080
COMMIT
`
	filter := `*filter
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-PROXY-FIREWALL -d 198.51.100.5/32 -p tcp -m comment --comment "ns/a:https traffic not accepted by KUBE-FW-A" -m tcp --dport 443 -j DROP
-A KUBE-PROXY-FIREWALL -d 198.51.100.6/32 -p tcp -m comment --comment "ns/b:https traffic not accepted by KUBE-FW-B" -m tcp --dport 443 -j DROP
COMMIT
`
	v := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{}}
	readFamily(v, ipv4, parseSave([]byte(nat)), parseSave([]byte(filter)))
	a := backends.Destination{Kind: backends.DestExternal, Addr: netip.MustParseAddr("198.51.100.5"), Protocol: plan.TCP, Port: 443}
	if got := v.Destinations[a].Allowed; len(got) != 2 || got[1] != netip.MustParsePrefix("198.51.100.5/32") {
		t.Errorf("%s allows %v, want 172.30.0.0/24 and its own address", a, got)
	}
	anomalies := strings.Join(v.Anomalies, "\n")
	if want := "nat chain KUBE-FW-B (for external IP 198.51.100.6:443/TCP) lets traffic through without a source range"; !strings.Contains(anomalies, want) {
		t.Errorf("anomalies do not say %q:\n%s", want, anomalies)
	}
}
