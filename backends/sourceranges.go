package backends

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// NodeIP returns the node's IP of one family as kube-proxy takes it for
// loadBalancerSourceRanges: the first of the plan node's addresses of that
// family, or the family's loopback address when the node has none.
func NodeIP(n plan.Node, v6 bool) netip.Addr {
	for _, a := range n.Addresses {
		if a = a.Unmap(); a.IsValid() && a.Is6() == v6 {
			return a
		}
	}
	if v6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// NodeSources returns the sources a service's load-balancer IPs accept in
// one family besides its loadBalancerSourceRanges, as kube-proxy's
// allowFromNode does: when one of the ranges of the family holds nodeIP,
// each load-balancer IP of the family as a single-address prefix. A
// load-balancer IP that is a local address of the node (IPVS puts them on
// its interface) is the source of the node's own connections to it, which
// the ranges then let in. Nil otherwise.
func NodeSources(s *plan.Service, nodeIP netip.Addr) []netip.Prefix {
	v6 := nodeIP.Is6()
	if !slices.ContainsFunc(s.SourceRanges, func(r netip.Prefix) bool {
		return r.Addr().Unmap().Is6() == v6 && unmapped(r).Contains(nodeIP)
	}) {
		return nil
	}
	var out []netip.Prefix
	for _, a := range s.LoadBalancerIPs {
		if a = a.Unmap(); a.Is6() == v6 {
			p := netip.PrefixFrom(a, a.BitLen())
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// unmapped returns r with an IPv4-mapped address as the IPv4 range it
// stands for.
func unmapped(r netip.Prefix) netip.Prefix {
	a := r.Addr()
	if !a.Is4In6() {
		return r
	}
	return netip.PrefixFrom(a.Unmap(), max(0, r.Bits()-96))
}
