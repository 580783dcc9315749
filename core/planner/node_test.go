package planner_test

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

func TestNode(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	prefixes := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	tests := []struct {
		name string
		node *corev1.Node
		want plan.Node
	}{{
		name: "nil node gives only the name",
		node: nil,
		want: plan.Node{Name: "node-a"},
	}, {
		name: "empty node",
		node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		want: plan.Node{Name: "node-a"},
	}, {
		name: "zone, addresses and pod CIDRs",
		node: &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
				corev1.LabelTopologyZone:   "eu-west-1a",
				corev1.LabelTopologyRegion: "eu-west-1",
				corev1.LabelHostname:       "node-a",
			}},
			Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:10:244::/64"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeHostName, Address: "node-a"},
				{Type: corev1.NodeInternalIP, Address: "192.168.10.11"},
				{Type: corev1.NodeInternalIP, Address: "fd00:192:168::11"},
				{Type: corev1.NodeExternalIP, Address: "203.0.113.11"},
				{Type: corev1.NodeInternalDNS, Address: "node-a.internal"},
				{Type: corev1.NodeExternalDNS, Address: "node-a.example.com"},
			}},
		},
		want: plan.Node{
			Name:      "node-a",
			Zone:      "eu-west-1a",
			Addresses: addrs("192.168.10.11", "fd00:192:168::11"),
			PodCIDRs:  prefixes("10.244.0.0/24", "fd00:10:244::/64"),
		},
	}, {
		name: "the deprecated failure-domain zone label is not read",
		node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
			"failure-domain.beta.kubernetes.io/zone": "old-zone",
		}}},
		want: plan.Node{Name: "node-a"},
	}, {
		name: "an address listed as both internal and external appears once",
		node: &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "198.51.100.7"},
			{Type: corev1.NodeExternalIP, Address: "198.51.100.7"},
		}}},
		want: plan.Node{Name: "node-a", Addresses: addrs("198.51.100.7")},
	}, {
		name: "one primary address per family, InternalIPs before ExternalIPs, like kube-proxy",
		node: &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeExternalIP, Address: "2001:db8::7"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.7"},
			{Type: corev1.NodeInternalIP, Address: "192.168.10.7"},
			{Type: corev1.NodeInternalIP, Address: "192.168.10.8"},
		}}},
		want: plan.Node{Name: "node-a", Addresses: addrs("192.168.10.7", "2001:db8::7")},
	}, {
		name: "only ExternalIPs of one family: the first",
		node: &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeExternalIP, Address: "203.0.113.7"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.8"},
		}}},
		want: plan.Node{Name: "node-a", Addresses: addrs("203.0.113.7")},
	}, {
		name: "bad addresses and CIDRs are skipped",
		node: &corev1.Node{
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.0.0/33", "10.244.1.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "192.168.10.300"},
				{Type: corev1.NodeInternalIP, Address: ""},
				{Type: corev1.NodeInternalIP, Address: "192.168.10.12"},
			}},
		},
		want: plan.Node{Name: "node-a", Addresses: addrs("192.168.10.12"), PodCIDRs: prefixes("10.244.1.0/24")},
	}, {
		name: "the configured name wins over the object's",
		node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1.ec2.internal"}},
		want: plan.Node{Name: "node-a"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planner.Node("node-a", source.NewCompactor().Node(tt.node))
			if got.Name != tt.want.Name || got.Zone != tt.want.Zone ||
				!slices.Equal(got.Addresses, tt.want.Addresses) || !slices.Equal(got.PodCIDRs, tt.want.PodCIDRs) {
				t.Errorf("Node() =\n  %s want\n  %s", got, tt.want)
			}
		})
	}
}
