package kubernetes

import (
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cidrList records the lists a source.ServiceCIDRHandler gets.
type cidrList struct{ last []netip.Prefix }

func (c *cidrList) OnServiceCIDRs(cidrs []netip.Prefix) { c.last = cidrs }

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestServiceCIDRsFold shows that the handler gets the union of every
// ServiceCIDR's ranges, sorted, masked and each once, after every change.
func TestServiceCIDRsFold(t *testing.T) {
	h := &cidrList{}
	c := &serviceCIDRs{h: h, byName: map[string][]netip.Prefix{}}
	want := func(what string, s ...string) {
		t.Helper()
		var w []netip.Prefix
		for _, p := range s {
			w = append(w, netip.MustParsePrefix(p))
		}
		if !slices.Equal(h.last, w) {
			t.Errorf("%s: %v, want %v", what, h.last, w)
		}
	}
	kube := serviceCIDR("kubernetes", "fd00:10:96::/112", "10.96.0.0/16")
	c.on(nil, kube)
	want("the default", "10.96.0.0/16", "fd00:10:96::/112")
	extra := serviceCIDR("extra", "10.97.0.1/24", "10.96.0.0/16", "not a range")
	c.on(nil, extra)
	want("one more", "10.96.0.0/16", "10.97.0.0/24", "fd00:10:96::/112")
	c.on(extra, nil)
	want("deleted", "10.96.0.0/16", "fd00:10:96::/112")
}
