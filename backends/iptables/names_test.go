package iptables

import (
	"net/netip"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

func TestNamesAreKubeProxys(t *testing.T) {
	// The names kube-proxy's own tests expect for service port ns1/svc1:p80
	// (TCP) and its endpoint 10.180.0.1:80, so Weir takes over kube-proxy's
	// chains and kube-proxy takes over Weir's.
	k := plan.Key{Namespace: "ns1", Name: "svc1", Port: "p80", Protocol: plan.TCP}
	c := chainsFor(servicePortName(k), protoName(k.Protocol))
	if c.svc != "KUBE-SVC-XPGD46QRK7WJZT7O" {
		t.Errorf("service chain %s, want KUBE-SVC-XPGD46QRK7WJZT7O", c.svc)
	}
	for got, want := range map[string]string{c.svl: "KUBE-SVL-", c.ext: "KUBE-EXT-", c.fw: "KUBE-FW-"} {
		if got != want+"XPGD46QRK7WJZT7O" {
			t.Errorf("chain %s, want %sXPGD46QRK7WJZT7O", got, want)
		}
	}
	sep := endpointChain(servicePortName(k), "tcp", netip.MustParseAddrPort("10.180.0.1:80"))
	if sep != "KUBE-SEP-SXIVWICOYRO3J4NJ" {
		t.Errorf("endpoint chain %s, want KUBE-SEP-SXIVWICOYRO3J4NJ", sep)
	}
}

func TestNamesDiffer(t *testing.T) {
	// The protocol, the port name and the endpoint all change the names;
	// every name fits iptables' 28-character limit.
	keys := []plan.Key{
		{Namespace: "ns", Name: "svc", Port: "p", Protocol: plan.TCP},
		{Namespace: "ns", Name: "svc", Port: "p", Protocol: plan.UDP},
		{Namespace: "ns", Name: "svc", Port: "", Protocol: plan.TCP},
		{Namespace: "ns", Name: "svc2", Port: "p", Protocol: plan.TCP},
	}
	seen := map[string]bool{}
	for _, k := range keys {
		for _, ep := range []string{"10.0.0.1:80", "10.0.0.1:81", "[fd00::1]:80"} {
			name := servicePortName(k)
			for _, c := range []string{chainsFor(name, protoName(k.Protocol)).svc, endpointChain(name, protoName(k.Protocol), netip.MustParseAddrPort(ep))} {
				if len(c) > 28 {
					t.Errorf("%s is longer than 28 characters", c)
				}
				if seen[c] && c[:9] == prefixSEP {
					t.Errorf("%s for %v %s repeats", c, k, ep)
				}
				seen[c] = true
			}
		}
	}
	if servicePortName(keys[2]) != "ns/svc" || servicePortName(keys[0]) != "ns/svc:p" {
		t.Errorf("port names %q, %q", servicePortName(keys[2]), servicePortName(keys[0]))
	}
}
