package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

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
	// endpoint.
	ByEndpoint map[netip.Addr]int
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
// serving's destinations by where their replies come from. It deletes
// nothing: weir diagnose uses it.
func (c *Cleaner) Count(ctx context.Context, serving []Serving) ([]FlowCount, error) {
	counts := make([]FlowCount, len(serving))
	byDest := map[key]int{}
	for i, s := range serving {
		counts[i] = FlowCount{Protocol: s.Protocol, Dest: s.Dest, ByEndpoint: map[netip.Addr]int{}}
		byDest[key{proto: anyProtoNumber(s.Protocol), addr: s.Dest.Addr().Unmap(), port: s.Dest.Port()}] = i
	}
	find := func(t tuple) (int, bool) {
		if i, ok := byDest[key{proto: t.proto, addr: t.dst.Addr(), port: t.dst.Port()}]; ok {
			return i, true
		}
		i, ok := byDest[key{proto: t.proto, port: t.dst.Port()}]
		return i, ok
	}
	conn, err := c.open()
	if err != nil {
		return nil, err
	}
	defer conn.close()
	release, err := conn.bind(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, err = conn.dump(func(b []byte) {
		e, ok, err := parseEntry(b, func(t tuple) bool { _, ok := find(t); return ok })
		if err != nil || !ok {
			return
		}
		i, _ := find(e.orig)
		counts[i].add(e.reply.src.Addr(), serving[i].Endpoints)
	})
	if err != nil {
		return nil, fmt.Errorf("conntrack: dump: %w", ctxErr(ctx, err))
	}
	return counts, nil
}

// add counts one entry whose reply comes from from.
func (f *FlowCount) add(from netip.Addr, serving []netip.Addr) {
	for _, a := range serving {
		if a == from {
			f.ByEndpoint[from]++
			return
		}
	}
	f.Stale++
	if len(f.StaleFrom) < 10 && !slices.Contains(f.StaleFrom, from) {
		f.StaleFrom = append(f.StaleFrom, from)
	}
}

// anyProtoNumber returns the IP protocol number of p, TCP included.
func anyProtoNumber(p plan.Protocol) uint8 {
	if p == plan.TCP {
		return unix.IPPROTO_TCP
	}
	return protoNumber(p)
}
