package diagnose

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// tracePlan has web (cluster IP, two endpoints of weights 3 and 1, the
// first on this node), lb (a load-balancer IP with a source range,
// externalTrafficPolicy Local, node port 30080, one endpoint elsewhere)
// and empty (no endpoints).
func tracePlan() *plan.Plan {
	addr, prefix := netip.MustParseAddr, netip.MustParsePrefix
	ep := func(a string, w uint32, local bool) plan.Endpoint {
		return plan.Endpoint{Address: addr(a), Port: 8080, Weight: w, Ready: true, Serving: true, Local: local, ForCluster: true, ForLocal: local}
	}
	web := &plan.Service{Key: plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{addr("10.96.0.10")}, Port: 80,
		Endpoints: []plan.Endpoint{ep("10.244.0.11", 3, true), ep("10.244.1.12", 1, false)}}
	lb := &plan.Service{Key: plan.Key{Namespace: "default", Name: "lb", Port: "http", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{addr("10.96.0.20")}, Port: 80, NodePort: 30080, ExternalLocal: true,
		LoadBalancerIPs: []netip.Addr{addr("192.0.2.100")}, SourceRanges: []netip.Prefix{prefix("203.0.113.0/24")},
		Endpoints: []plan.Endpoint{ep("10.244.1.12", 1, false)}}
	empty := &plan.Service{Key: plan.Key{Namespace: "default", Name: "empty", Port: "", Protocol: plan.UDP},
		ClusterIPs: []netip.Addr{addr("10.96.0.30")}, Port: 53}
	return &plan.Plan{
		Node:         plan.Node{Name: "node-a", Addresses: []netip.Addr{addr("192.0.2.10")}, PodCIDRs: []netip.Prefix{prefix("10.244.0.0/24")}},
		ServiceCIDRs: []netip.Prefix{prefix("10.96.0.0/16")},
		Services:     map[plan.Key]*plan.Service{web.Key: web, lb.Key: lb, empty.Key: empty},
	}
}

func TestTrace(t *testing.T) {
	tests := []struct {
		name, from, to string
		proto          plan.Protocol
		masqAll        bool
		want           []string // codes
		contains       string   // in some message
	}{
		{"pod to cluster IP", "10.244.0.11", "10.96.0.10:80", plan.TCP, false,
			[]string{"trace.service", "trace.endpoints", "trace.masquerade"}, "10.244.0.11:8080 (75.0%), 10.244.1.12:8080 (25.0%)"},
		{"hairpin", "10.244.0.11", "10.96.0.10:80", plan.TCP, false, nil, "lands on 10.244.0.11 itself is masqueraded (hairpin)"},
		{"pod keeps its address", "10.244.1.5", "10.96.0.10:80", plan.TCP, false, nil, "not masqueraded: the endpoint sees 10.244.1.5 (pod traffic)"},
		{"outside is masqueraded", "198.51.100.7", "10.96.0.10:80", plan.TCP, false, nil, "masqueraded: the endpoint sees this node's address (the source is not a pod's)"},
		{"masqueradeAll", "10.244.1.5", "10.96.0.10:80", plan.TCP, true, nil, "masqueraded (masqueradeAll)"},
		{"no endpoints", "10.244.0.11", "10.96.0.30:53", plan.UDP, false, []string{"trace.service", "trace.rejected"}, "has no endpoints"},
		{"wrong protocol", "10.244.0.11", "10.96.0.30:53", plan.TCP, false, []string{"trace.dropped-no-service"}, "inside the service range 10.96.0.0/16"},
		{"not a service", "10.244.0.11", "8.8.8.8:53", plan.UDP, false, []string{"trace.no-service"}, "leave the connection alone"},
		{"source range excludes", "198.51.100.7", "192.0.2.100:80", plan.TCP, false,
			[]string{"trace.service", "trace.dropped-source-range"}, "outside the load balancer's source ranges (loadBalancerSourceRanges: 203.0.113.0/24)"},
		{"ETP Local without local endpoints", "203.0.113.9", "192.0.2.100:80", plan.TCP, false,
			[]string{"trace.service", "trace.dropped-policy"}, "externalTrafficPolicy is Local"},
		{"node port from outside", "198.51.100.7", "192.0.2.10:30080", plan.TCP, false, []string{"trace.service", "trace.dropped-policy"}, "node port 0.0.0.0:30080/TCP"},
		{"node port from the node short-circuits", "192.0.2.10", "192.0.2.10:30080", plan.TCP, false,
			[]string{"trace.service", "trace.short-circuit", "trace.endpoints", "trace.masquerade"}, "masqueraded: the endpoint sees this node's address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Trace(TraceInput{From: netip.MustParseAddr(tt.from), To: netip.MustParseAddrPort(tt.to), Protocol: tt.proto,
				Plan: tracePlan(), Mode: "nftables", Detector: backends.DetectClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
				MasqueradeAll: tt.masqAll})
			var codes, msgs []string
			for _, f := range got {
				codes = append(codes, f.Code)
				msgs = append(msgs, f.Message)
			}
			if tt.want != nil && !slices.Equal(codes, tt.want) {
				t.Errorf("codes %q, want %q", codes, tt.want)
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tt.contains) {
				t.Errorf("no %q in:\n%s", tt.contains, strings.Join(msgs, "\n"))
			}
		})
	}
}

// TestTraceHairpinOnlyOnThisNode checks that in mode nftables a pod the
// slices place elsewhere is not told its connection to itself is
// masqueraded, and in mode iptables it is.
func TestTraceHairpinOnlyOnThisNode(t *testing.T) {
	for mode, want := range map[string]bool{"nftables": false, "iptables": true} {
		got := Trace(TraceInput{From: netip.MustParseAddr("10.244.1.12"), To: netip.MustParseAddrPort("10.96.0.10:80"), Protocol: plan.TCP,
			Plan: tracePlan(), Mode: mode, Detector: backends.DetectClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
		var msgs []string
		for _, f := range got {
			msgs = append(msgs, f.Message)
		}
		if has := strings.Contains(strings.Join(msgs, "\n"), "(hairpin)"); has != want {
			t.Errorf("mode %s: hairpin said %v, want %v:\n%s", mode, has, want, strings.Join(msgs, "\n"))
		}
	}
}
