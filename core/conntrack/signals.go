package conntrack

import (
	"context"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// Signals reads the table once and returns, for each service, the live
// signals of its endpoints, aligned with services[i].Endpoints: the
// connections open to each (Active, as EndpointLoad counts them) and
// those opened since the previous complete read (New), summed over every
// destination of the service: its cluster IPs, node port, external and
// load-balancer IPs. The connections to an address count for every
// endpoint with that address (the table knows addresses, not which of a
// pod's ports served a reply to a destination port). hooks.Chain.Poll
// calls it, for the services its plugins with signals last saw; it is
// bounded by the Load's Limits, and a truncated read gives lower bounds.
func (l *Load) Signals(ctx context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	var serving []Serving
	owner := make([]int, 0, len(services)) // the service of each destination
	addrs := make([][]netip.Addr, len(services))
	at := make([][]int, len(services)) // at[i][j]: endpoint j's address in addrs[i]
	for i, s := range services {
		addrs[i], at[i] = endpointAddrs(s)
		for _, d := range destinations(s) {
			serving = append(serving, Serving{Protocol: s.Key.Protocol, Dest: d, Endpoints: addrs[i]})
			owner = append(owner, i)
		}
	}
	rep, err := l.Read(ctx, serving)
	if err != nil {
		return nil, err
	}
	sums := make([][]abi.Signals, len(services)) // per address
	for i := range services {
		sums[i] = make([]abi.Signals, len(addrs[i]))
	}
	for j, d := range rep.Dests {
		sum := sums[owner[j]]
		for k, load := range d.Endpoints {
			sum[k].Active += uint32(load.Active)
			sum[k].New += uint32(load.New)
		}
	}
	out := make([][]abi.Signals, len(services))
	for i, s := range services {
		out[i] = make([]abi.Signals, len(s.Endpoints))
		for j := range s.Endpoints {
			out[i][j] = sums[i][at[i][j]]
		}
	}
	return out, nil
}

// endpointAddrs returns the distinct addresses of s's endpoints, unmapped,
// and for each endpoint the index of its address among them.
func endpointAddrs(s *plan.Service) ([]netip.Addr, []int) {
	addrs := make([]netip.Addr, 0, len(s.Endpoints))
	at := make([]int, len(s.Endpoints))
	var seen map[netip.Addr]int // for a service too big for a linear search
	if len(s.Endpoints) > 16 {
		seen = make(map[netip.Addr]int, len(s.Endpoints))
	}
	for j := range s.Endpoints {
		a := s.Endpoints[j].Address.Unmap()
		var k int
		var ok bool
		if seen != nil {
			k, ok = seen[a]
		} else {
			k = slices.Index(addrs, a)
			ok = k >= 0
		}
		if !ok {
			k = len(addrs)
			addrs = append(addrs, a)
			if seen != nil {
				seen[a] = k
			}
		}
		at[j] = k
	}
	return addrs, at
}
