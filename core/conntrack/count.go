package conntrack

import (
	"context"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

// FlowCount is what the conntrack table holds for one destination of a
// service port: its entries counted by where their replies come from.
type FlowCount struct {
	Protocol plan.Protocol
	// Dest is a service address and port, or a zero address with a node
	// port.
	Dest netip.AddrPort
	// ByEndpoint counts the entries whose replies come from each serving
	// endpoint, and Active those of them that are active connections
	// (see EndpointLoad); endpoints without any are left out.
	ByEndpoint map[netip.Addr]int
	Active     map[netip.Addr]int
	// Stale counts the entries whose replies come from an address that is
	// no serving endpoint (an endpoint gone, or a flow that got through
	// before the service had rules), and StaleFrom lists those addresses.
	Stale     int
	StaleFrom []netip.Addr
}

// Total returns the destination's entries.
func (f FlowCount) Total() int {
	n := f.Stale
	for _, c := range f.ByEndpoint {
		n += c
	}
	return n
}

// DestinationsOf returns every destination of s, whatever its protocol,
// each with the addresses of its serving endpoints.
func DestinationsOf(s *plan.Service) []Serving {
	var eps []netip.Addr
	for _, e := range s.Endpoints {
		if e.Serving {
			eps = append(eps, e.Address.Unmap())
		}
	}
	var out []Serving
	for _, d := range destinations(s) {
		out = append(out, Serving{Protocol: s.Key.Protocol, Dest: d, Endpoints: eps})
	}
	return out
}

// Count reads the conntrack table once and counts the entries to each of
// serving's destinations by where their replies come from, and how many of
// them are active connections. It deletes nothing: weir diagnose uses it.
// Only ctx bounds it: it reads the whole table.
func (c *Cleaner) Count(ctx context.Context, serving []Serving) ([]FlowCount, error) {
	var idx destIndex
	idx.build(serving)
	rep := newReport(serving)
	if err := newTally(serving, &idx, rep).run(ctx, c); err != nil {
		return nil, fmt.Errorf("conntrack: dump: %w", ctxErr(ctx, err))
	}
	counts := make([]FlowCount, len(serving))
	for i, s := range serving {
		counts[i] = flowCount(s, rep.Dests[i])
	}
	return counts, nil
}

// flowCount folds one destination's load into a FlowCount.
func flowCount(s Serving, d DestLoad) FlowCount {
	f := FlowCount{Protocol: s.Protocol, Dest: s.Dest, ByEndpoint: map[netip.Addr]int{}, Active: map[netip.Addr]int{},
		Stale: d.Stale.Tracked, StaleFrom: d.StaleFrom}
	for j, l := range d.Endpoints {
		a := s.Endpoints[j].Unmap()
		if l.Tracked > 0 {
			f.ByEndpoint[a] += l.Tracked
		}
		if l.Active > 0 {
			f.Active[a] += l.Active
		}
	}
	return f
}

// anyProtoNumber returns the IP protocol number of p, TCP included.
func anyProtoNumber(p plan.Protocol) uint8 {
	if p == plan.TCP {
		return unix.IPPROTO_TCP
	}
	return protoNumber(p)
}
