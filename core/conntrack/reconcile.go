package conntrack

import (
	"context"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

// Serving is one destination of a UDP or SCTP service port and the
// addresses of the endpoints its flows may be DNATed to.
type Serving struct {
	Protocol plan.Protocol
	// Dest is a service address and port, or a zero address with a node
	// port (every destination address at that port, as in Flow).
	Dest netip.AddrPort
	// Endpoints are the addresses of the service port's serving
	// endpoints.
	Endpoints []netip.Addr
}

// ServingOf returns the destinations of s, when it is a UDP or SCTP
// service port, each with the addresses of its serving endpoints. Like
// kube-proxy's reconciler, it counts every endpoint whose Serving
// condition holds, whatever the traffic policies, the topology or the
// plugins decided: those decide new flows, not established ones.
func ServingOf(s *plan.Service) []Serving {
	if s == nil || protoNumber(s.Key.Protocol) == 0 {
		return nil
	}
	return DestinationsOf(s)
}

// Deleted counts deleted conntrack entries per IP family, as the metrics
// of kube-proxy's reconciler split them.
type Deleted struct {
	IPv4, IPv6 int
}

// Total returns the entries deleted in both families.
func (d Deleted) Total() int { return d.IPv4 + d.IPv6 }

// plus returns the sum of two counts.
func (d Deleted) plus(o Deleted) Deleted {
	return Deleted{IPv4: d.IPv4 + o.IPv4, IPv6: d.IPv6 + o.IPv6}
}

// count adds one entry of the address family af (AF_INET or AF_INET6).
func (d *Deleted) count(af uint8) {
	if af == unix.AF_INET6 {
		d.IPv6++
	} else {
		d.IPv4++
	}
}

// Reconcile deletes the UDP and SCTP entries whose original destination is
// one of serving's and whose reply does not come from one of its
// endpoints: flows DNATed to an endpoint that went away while nobody
// watched (Weir restarting, say), and flows that got through un-NATed
// before the service had rules. It spares the flows that still reach a
// serving endpoint, which a restart must not cut (kubernetes#122740). It
// reads the table once, both families together, and returns how many
// entries it deleted in each.
func (c *Cleaner) Reconcile(ctx context.Context, serving []Serving) (Deleted, error) {
	byDest := map[key]map[netip.Addr]bool{}
	for _, s := range serving {
		k := key{proto: protoNumber(s.Protocol), addr: s.Dest.Addr().Unmap(), port: s.Dest.Port()}
		if k.proto == 0 || k.port == 0 {
			continue
		}
		eps := byDest[k]
		if eps == nil {
			eps = map[netip.Addr]bool{}
			byDest[k] = eps
		}
		for _, a := range s.Endpoints {
			eps[a.Unmap()] = true
		}
	}
	if len(byDest) == 0 {
		return Deleted{}, nil
	}
	lookup := func(t tuple) (key, map[netip.Addr]bool) {
		k := key{proto: t.proto, addr: t.dst.Addr(), port: t.dst.Port()}
		if eps, ok := byDest[k]; ok {
			return k, eps
		}
		k.addr = netip.Addr{}
		return k, byDest[k]
	}
	wanted := func(t tuple) bool {
		_, eps := lookup(t)
		return eps != nil
	}
	pick := func(e *entry) (string, bool) {
		k, eps := lookup(e.orig)
		if eps == nil || eps[e.reply.src.Addr()] {
			return "", false
		}
		return "no serving endpoint of " + describeKey(k) + " answers it", true
	}
	deleted, errs := c.sweep(ctx, "the reconciliation of "+strconv.Itoa(len(byDest))+" destinations", wanted, pick)
	return deleted, joinCapped(errs)
}

// describeKey names a destination as a Flow would.
func describeKey(k key) string {
	proto := plan.UDP
	if k.proto == protoNumber(plan.SCTP) {
		proto = plan.SCTP
	}
	return Flow{Protocol: proto, Dest: netip.AddrPortFrom(k.addr, k.port)}.String()
}
