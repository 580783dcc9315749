package nftables

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// maxBuckets bounds the buckets (map elements) of one service; weights whose
// reduced sum exceeds it are scaled down proportionally.
const maxBuckets = 4096

// pool is a set of buckets under one target id: the endpoints one kind of
// traffic is balanced over.
type pool struct {
	target uint32
	// buckets holds the endpoint of every bucket; its length is the pool's
	// total weight W, zero when the traffic has no endpoint to go to.
	buckets []netip.AddrPort
}

func (p pool) weight() uint32 { return uint32(len(p.buckets)) }

// serviceState is what the backend wrote to the kernel for one service port.
type serviceState struct {
	proto    plan.Protocol
	port     uint16
	nodePort uint16
	ips      []netip.Addr
	// internal serves cluster-IP traffic, external serves node ports. They
	// share a target when they hold the same endpoints.
	internal, external pool
	// externalLocal keeps the client's address on external traffic
	// (externalTrafficPolicy: Local): no masquerade.
	externalLocal bool
	// hasEndpoints tells an empty pool whose service has endpoints elsewhere
	// (traffic is dropped, like kube-proxy) from a service with none at all
	// (rejected).
	hasEndpoints bool
}

// newServiceState computes the state a plan service needs, or nil when the
// service has nothing this backend can program (no IPv4 address, no node
// port). A service takes two target ids: target for internal traffic and
// target+1 for external traffic when it differs.
func newServiceState(svc *plan.Service, target uint32) *serviceState {
	if _, err := protoNumber(svc.Key.Protocol); err != nil {
		return nil
	}
	st := &serviceState{proto: svc.Key.Protocol, port: svc.Port, nodePort: svc.NodePort, externalLocal: svc.ExternalLocal}
	for _, ip := range svc.ClusterIPs {
		if ip.Is4() {
			st.ips = append(st.ips, ip)
		}
	}
	if len(st.ips) == 0 && st.nodePort == 0 {
		return nil
	}
	st.internal = pool{target: target, buckets: buckets(svc.Endpoints, svc.InternalLocal)}
	st.external = pool{target: target, buckets: buckets(svc.Endpoints, svc.ExternalLocal)}
	if svc.InternalLocal != svc.ExternalLocal {
		st.external.target = target + 1
	}
	st.hasEndpoints = slices.ContainsFunc(svc.Endpoints, func(e plan.Endpoint) bool { return e.Address.Is4() })
	return st
}

// pools returns the state's distinct pools.
func (s *serviceState) pools() []pool {
	if s == nil {
		return nil
	}
	if s.external.target == s.internal.target {
		return []pool{s.internal}
	}
	return []pool{s.internal, s.external}
}

// buckets spreads the endpoints serving one traffic policy (the local set
// or the cluster set) over buckets in proportion to their weights, reduced
// by their greatest common divisor and capped at maxBuckets.
func buckets(eps []plan.Endpoint, local bool) []netip.AddrPort {
	var weights []uint64
	var addrs []netip.AddrPort
	for _, e := range eps {
		if e.Weight == 0 || !e.Address.Is4() || (local && !e.ForLocal) || (!local && !e.ForCluster) {
			continue
		}
		weights = append(weights, uint64(e.Weight))
		addrs = append(addrs, e.AddrPort())
	}
	weights = scaleWeights(weights)
	var out []netip.AddrPort
	for i, w := range weights {
		for range w {
			out = append(out, addrs[i])
		}
	}
	return out
}

func scaleWeights(w []uint64) []uint64 {
	var g, sum uint64
	for _, x := range w {
		g = gcd(g, x)
	}
	for i := range w {
		w[i] /= g
		sum += w[i]
	}
	if sum <= maxBuckets {
		return w
	}
	for i := range w {
		w[i] = max(1, w[i]*maxBuckets/sum)
	}
	return w
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// hairpinAddrs returns the distinct endpoint addresses of the state.
func (s *serviceState) hairpinAddrs() []netip.Addr {
	var out []netip.Addr
	for _, p := range s.pools() {
		for _, b := range p.buckets {
			if !slices.Contains(out, b.Addr()) {
				out = append(out, b.Addr())
			}
		}
	}
	return out
}

// sameEntries reports whether both states route the same keys the same way.
func sameEntries(a, b *serviceState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.proto == b.proto && a.port == b.port && a.nodePort == b.nodePort && slices.Equal(a.ips, b.ips) &&
		a.externalLocal == b.externalLocal && a.hasEndpoints == b.hasEndpoints &&
		a.internal.target == b.internal.target && a.internal.weight() == b.internal.weight() &&
		a.external.target == b.external.target && a.external.weight() == b.external.weight()
}

// entryElements returns the elements that send the service's addresses to
// their pick chains; an empty pool's addresses go to the drop sets when the
// service has endpoints elsewhere, to the reject sets when it has none.
func (s *serviceState) entryElements(add func(set string, e element)) {
	in := s.internal
	for _, ip := range s.ips {
		key := ipKey(ip, s.proto, s.port)
		switch {
		case in.weight() > 0:
			add(setServiceIPs, gotoElement(key, pickIPChain(in.weight())))
			add(setIPTargets, targetElement(key, in.target))
		case s.hasEndpoints:
			add(setDropIPs, element{Key: key})
		default:
			add(setNoEPIPs, element{Key: key})
		}
	}
	if s.nodePort == 0 {
		return
	}
	ex := s.external
	key := portKey(s.proto, s.nodePort)
	switch {
	case ex.weight() > 0:
		chain := pickNPChain(ex.weight())
		if s.externalLocal {
			chain = pickNPLocalChain(ex.weight())
		}
		add(setNodePorts, gotoElement(key, chain))
		add(setNPTargets, targetElement(key, ex.target))
	case s.hasEndpoints:
		add(setDropNodePorts, element{Key: key})
	default:
		add(setNoEPNodePorts, element{Key: key})
	}
}

// bucketElements returns the endpoints-W elements of the given buckets.
func (p pool) bucketElements(idx []int) []element {
	out := make([]element, 0, len(idx))
	for _, i := range idx {
		out = append(out, bucketElement(p.target, uint32(i), p.buckets[i]))
	}
	return out
}

func (p pool) allBuckets() []int {
	idx := make([]int, len(p.buckets))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// changedBuckets returns the buckets whose endpoint differs between pools of
// the same target and weight.
func changedBuckets(old, cur pool) []int {
	var idx []int
	for i := range cur.buckets {
		if old.buckets[i] != cur.buckets[i] {
			idx = append(idx, i)
		}
	}
	return idx
}
