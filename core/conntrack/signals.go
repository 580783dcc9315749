package conntrack

import (
	"context"
	"net/netip"

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
	for i, s := range services {
		addrs[i] = endpointAddrs(s)
		for _, d := range destinations(s) {
			serving = append(serving, Serving{Protocol: s.Key.Protocol, Dest: d, Endpoints: addrs[i]})
			owner = append(owner, i)
		}
	}
	rep, err := l.Read(ctx, serving)
	if err != nil {
		return nil, err
	}
	byAddr := make([]map[netip.Addr]abi.Signals, len(services))
	for j, d := range rep.Dests {
		i := owner[j]
		if byAddr[i] == nil {
			byAddr[i] = make(map[netip.Addr]abi.Signals, len(addrs[i]))
		}
		for k, load := range d.Endpoints {
			a := addrs[i][k]
			sig := byAddr[i][a]
			sig.Active += uint32(load.Active)
			sig.New += uint32(load.New)
			byAddr[i][a] = sig
		}
	}
	out := make([][]abi.Signals, len(services))
	for i, s := range services {
		out[i] = make([]abi.Signals, len(s.Endpoints))
		for j := range s.Endpoints {
			out[i][j] = byAddr[i][s.Endpoints[j].Address.Unmap()]
		}
	}
	return out, nil
}

// endpointAddrs returns the distinct addresses of s's endpoints, unmapped.
func endpointAddrs(s *plan.Service) []netip.Addr {
	out := make([]netip.Addr, 0, len(s.Endpoints))
	seen := make(map[netip.Addr]bool, len(s.Endpoints))
	for _, e := range s.Endpoints {
		a := e.Address.Unmap()
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}
