package nftables

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// maxBuckets bounds the buckets (map elements) of one service; weights whose
// reduced sum exceeds it are scaled down proportionally.
const maxBuckets = 4096

// pool is the endpoints one kind of traffic is balanced over, as buckets.
type pool struct {
	// buckets holds the endpoint of every bucket; its length is the pool's
	// total weight W, zero when the traffic has no endpoint to go to.
	buckets []netip.AddrPort
}

func (p pool) weight() uint32 { return uint32(len(p.buckets)) }

// serviceState is what the backend wrote to the kernel for one service port.
type serviceState struct {
	// key names the service port; the affinity sets and sticky chains
	// carry it in their names.
	key plan.Key
	// comment is what its elements and chains carry (portComment), set
	// once the state is to be written (changes.update).
	comment  string
	proto    plan.Protocol
	port     uint16
	nodePort uint16
	ips      []netip.Addr
	// extIPs are the external and load-balancer IPs, served like node ports.
	extIPs []netip.Addr
	// lbIPs are the load-balancer IPs and ranges the sources allowed to use
	// them; no ranges means everyone. With loadBalancerSourceRanges
	// holding the node's IP, ranges also allow each load-balancer IP as a
	// source (backends.NodeSources), as kube-proxy does.
	lbIPs  []netip.Addr
	ranges []netip.Prefix
	// affinity is the ClientIP affinity timeout in seconds, 0 for none.
	affinity uint32
	// internal serves cluster-IP traffic, external serves node ports and
	// external IPs; cluster is the cluster's endpoints, which the short
	// circuit of a Local external policy uses whatever the internal one.
	internal, external, cluster pool
	// externalLocal keeps the client's address on external traffic
	// (externalTrafficPolicy: Local): no masquerade.
	externalLocal bool
	// internalLocal is internalTrafficPolicy: Local; the internal pool is
	// then not the cluster's endpoints.
	internalLocal bool
	// hasEndpoints tells an empty pool whose service has endpoints elsewhere
	// (traffic is dropped, like kube-proxy) from a service with none at all
	// (rejected).
	hasEndpoints bool
	// local holds the distinct addresses of its endpoints on this node, in
	// order: the only ones the hairpin set holds, as in kube-proxy's
	// nftables mode (a pod can reach itself only on its own node).
	local []netip.Addr
}

// newServiceState computes the state a plan service needs, or nil when the
// service has nothing this backend can program (no address of the family,
// no node port); nodeIP is the node's IP of the family (backends.NodeIP).
func newServiceState(svc *plan.Service, f *family, nodeIP netip.Addr) *serviceState {
	if _, err := protoNumber(svc.Key.Protocol); err != nil {
		return nil
	}
	st := &serviceState{key: svc.Key, proto: svc.Key.Protocol, port: svc.Port, nodePort: svc.NodePort,
		externalLocal: svc.ExternalLocal, internalLocal: svc.InternalLocal}
	st.ips = inFamily(f, svc.ClusterIPs)
	st.extIPs = inFamily(f, append(slices.Clone(svc.ExternalIPs), svc.LoadBalancerIPs...))
	if len(svc.SourceRanges) > 0 {
		// Ranges of the other family only still close this family's addresses.
		st.lbIPs = inFamily(f, svc.LoadBalancerIPs)
		st.ranges = prefixesOf(f, append(slices.Clone(svc.SourceRanges), backends.NodeSources(svc, nodeIP)...))
	}
	if len(st.ips) == 0 && len(st.extIPs) == 0 && st.nodePort == 0 {
		return nil
	}
	if svc.Affinity != nil {
		st.affinity = max(svc.Affinity.TimeoutSeconds, 1)
	}
	// Pools of the same endpoint set share their buckets.
	st.internal = pool{buckets: buckets(f, svc.Endpoints, svc.InternalLocal)}
	st.external = st.internal
	if svc.ExternalLocal != svc.InternalLocal {
		st.external = pool{buckets: buckets(f, svc.Endpoints, svc.ExternalLocal)}
	}
	switch {
	case svc.ExternalLocal && svc.InternalLocal:
		st.cluster = pool{buckets: buckets(f, svc.Endpoints, false)}
	case svc.ExternalLocal:
		st.cluster = st.internal
	}
	st.hasEndpoints = slices.ContainsFunc(svc.Endpoints, func(e plan.Endpoint) bool { return f.is(e.Address) })
	for _, e := range svc.Endpoints {
		if e.Local && f.is(e.Address) {
			st.local = append(st.local, e.Address)
		}
	}
	slices.SortFunc(st.local, netip.Addr.Compare)
	st.local = slices.Compact(st.local)
	return st
}

// inFamily returns the distinct addresses of family f.
func inFamily(f *family, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if f.is(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// ranged reports whether the state's rules depend on the node's IP: it has
// load-balancer IPs limited by source ranges.
func (s *serviceState) ranged() bool { return s != nil && len(s.lbIPs) > 0 }

// pools returns the state's distinct pools.
func (s *serviceState) pools() []pool {
	if s == nil {
		return nil
	}
	out := []pool{s.internal}
	if s.externalLocal != s.internalLocal {
		out = append(out, s.external)
	}
	if s.cluster.weight() > 0 && s.internalLocal {
		out = append(out, s.cluster)
	}
	return out
}

// buckets spreads the endpoints serving one traffic policy (the local set
// or the cluster set) over buckets in proportion to their weights, reduced
// by their greatest common divisor and scaled down, each to at least one,
// when their sum exceeds maxBuckets.
func buckets(f *family, eps []plan.Endpoint, local bool) []netip.AddrPort {
	serves := func(e *plan.Endpoint) bool {
		return e.Weight > 0 && f.is(e.Address) && ((local && e.ForLocal) || (!local && e.ForCluster))
	}
	var g, sum uint64
	for i := range eps {
		if serves(&eps[i]) {
			g = gcd(g, uint64(eps[i].Weight))
		}
	}
	for i := range eps {
		if serves(&eps[i]) {
			sum += uint64(eps[i].Weight) / g
		}
	}
	n := func(e *plan.Endpoint) uint64 {
		w := uint64(e.Weight) / g
		if sum > maxBuckets {
			w = max(1, w*maxBuckets/sum)
		}
		return w
	}
	total := 0
	for i := range eps {
		if serves(&eps[i]) {
			total += int(n(&eps[i]))
		}
	}
	if total == 0 {
		return nil
	}
	out := make([]netip.AddrPort, 0, total)
	for i := range eps {
		if serves(&eps[i]) {
			for range n(&eps[i]) {
				out = append(out, eps[i].AddrPort())
			}
		}
	}
	return out
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// eachHairpin calls fn with the endpoints of the state's pools that are
// on this node, once per run of buckets at one endpoint: a reference
// count moved from one state to another with it stays zero exactly when
// no state has the endpoint.
func (s *serviceState) eachHairpin(fn func(hairpinKey)) {
	if len(s.local) == 0 {
		return
	}
	for _, p := range s.pools() {
		for i, b := range p.buckets {
			if (i == 0 || p.buckets[i-1] != b) && slices.Contains(s.local, b.Addr()) {
				fn(hairpinKey{addr: addrKeyOf(b.Addr()), proto: s.proto, port: b.Port()})
			}
		}
	}
}

// sameEntries reports whether both states route the same keys the same way.
func sameEntries(a, b *serviceState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.proto == b.proto && a.port == b.port && a.nodePort == b.nodePort && slices.Equal(a.ips, b.ips) &&
		slices.Equal(a.extIPs, b.extIPs) && a.affinity == b.affinity &&
		slices.Equal(a.lbIPs, b.lbIPs) && slices.Equal(a.ranges, b.ranges) &&
		a.externalLocal == b.externalLocal && a.internalLocal == b.internalLocal && a.hasEndpoints == b.hasEndpoints &&
		a.internal.weight() == b.internal.weight() && a.external.weight() == b.external.weight() &&
		a.cluster.weight() == b.cluster.weight()
}

// same reports whether two states need the same elements, rules and
// counts: the same entries and the same buckets.
func same(a, b *serviceState) bool {
	return sameEntries(a, b) && (a == nil || (a.key == b.key && slices.Equal(a.internal.buckets, b.internal.buckets) &&
		slices.Equal(a.external.buckets, b.external.buckets) && slices.Equal(a.cluster.buckets, b.cluster.buckets) &&
		slices.Equal(a.local, b.local)))
}

// changed reports whether bucket i differs between pools of the same
// weight.
func changed(old, cur pool, i int) bool { return old.buckets[i] != cur.buckets[i] }

// changedBuckets returns the buckets whose endpoint differs between pools of
// the same weight.
func changedBuckets(old, cur pool) []int {
	var idx []int
	for i := range cur.buckets {
		if changed(old, cur, i) {
			idx = append(idx, i)
		}
	}
	return idx
}
