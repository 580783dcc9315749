package conntrack

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// StaleFlows returns the flows to clear after a service port changed from
// old to cur; old is nil for a new service port, cur nil for a removed one.
// Only UDP and SCTP ports have any; the result is sorted and has no
// duplicates.
//
// An endpoint of old is removed when no endpoint of cur has the same
// address and port (a change of readiness or weight is not a removal: a
// drained endpoint keeps its flows). Each removed endpoint gives a flow,
// limited to that endpoint, for every service address of old and cur (cluster,
// external and load-balancer IPs of the endpoint's family) at the service
// port, and one for the node port with a zero address.
//
// A service port that goes from no usable endpoint (none of weight above
// zero: its traffic was rejected) to at least one gives a flow, for any
// endpoint, per service address of cur at the port and for its node port.
func StaleFlows(old, cur *plan.Service) []Flow {
	proto := protocolOf(old, cur)
	if protoNumber(proto) == 0 {
		return nil
	}
	var out []Flow
	if removed := removedEndpoints(old, cur); len(removed) > 0 {
		dests := append(destinations(old), destinations(cur)...)
		for _, ep := range removed {
			for _, d := range dests {
				if d.Addr().IsValid() && d.Addr().Is4() != ep.Is4() {
					continue // a DNAT never crosses families
				}
				out = append(out, Flow{Protocol: proto, Dest: d, Endpoint: ep})
			}
		}
	}
	if usable(cur) && !usable(old) {
		for _, d := range destinations(cur) {
			out = append(out, Flow{Protocol: proto, Dest: d})
		}
	}
	slices.SortFunc(out, compareFlows)
	return slices.Compact(out)
}

// protocolOf returns the protocol of the service port old and cur describe.
func protocolOf(old, cur *plan.Service) plan.Protocol {
	if cur != nil {
		return cur.Key.Protocol
	}
	if old != nil {
		return old.Key.Protocol
	}
	return ""
}

// removedEndpoints returns the addresses of old's endpoints whose address
// and port are not among cur's.
func removedEndpoints(old, cur *plan.Service) []netip.Addr {
	if old == nil {
		return nil
	}
	kept := map[netip.AddrPort]bool{}
	if cur != nil {
		for _, e := range cur.Endpoints {
			kept[normalize(e.AddrPort())] = true
		}
	}
	var out []netip.Addr
	for _, e := range old.Endpoints {
		if ap := normalize(e.AddrPort()); ap.Addr().IsValid() && !kept[ap] {
			out = append(out, ap.Addr())
		}
	}
	return out
}

// destinations returns the original destinations of s's traffic: each
// service address at the port, and the node port with a zero address.
func destinations(s *plan.Service) []netip.AddrPort {
	if s == nil {
		return nil
	}
	var out []netip.AddrPort
	if s.Port != 0 {
		for _, list := range [][]netip.Addr{s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs} {
			for _, a := range list {
				if a.IsValid() {
					out = append(out, netip.AddrPortFrom(a.Unmap(), s.Port))
				}
			}
		}
	}
	if s.NodePort != 0 {
		out = append(out, netip.AddrPortFrom(netip.Addr{}, s.NodePort))
	}
	return out
}

// usable reports whether s has an endpoint that receives traffic.
func usable(s *plan.Service) bool {
	return s != nil && slices.ContainsFunc(s.Endpoints, func(e plan.Endpoint) bool { return e.Weight > 0 })
}

func normalize(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// compareFlows orders flows by protocol, destination and endpoint.
func compareFlows(a, b Flow) int {
	return cmp.Or(
		cmp.Compare(a.Protocol, b.Protocol),
		a.Dest.Compare(b.Dest),
		a.Endpoint.Compare(b.Endpoint),
	)
}
