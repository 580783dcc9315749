package nftables

import (
	"net/netip"
	"slices"

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
	key      plan.Key
	proto    plan.Protocol
	port     uint16
	nodePort uint16
	ips      []netip.Addr
	// extIPs are the external and load-balancer IPs, served like node ports.
	extIPs []netip.Addr
	// lbIPs are the load-balancer IPs and ranges the sources allowed to use
	// them; no ranges means everyone.
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
}

// newServiceState computes the state a plan service needs, or nil when the
// service has nothing this backend can program (no address of the family,
// no node port).
func newServiceState(svc *plan.Service, f *family) *serviceState {
	if _, err := protoNumber(svc.Key.Protocol); err != nil {
		return nil
	}
	st := &serviceState{key: svc.Key, proto: svc.Key.Protocol, port: svc.Port, nodePort: svc.NodePort,
		externalLocal: svc.ExternalLocal, internalLocal: svc.InternalLocal}
	st.ips = inFamily(f, svc.ClusterIPs)
	st.extIPs = inFamily(f, append(slices.Clone(svc.ExternalIPs), svc.LoadBalancerIPs...))
	st.ranges = prefixesOf(f, svc.SourceRanges)
	if len(svc.SourceRanges) > 0 {
		// Ranges of the other family only still close this family's addresses.
		st.lbIPs = inFamily(f, svc.LoadBalancerIPs)
	}
	if len(st.ips) == 0 && len(st.extIPs) == 0 && st.nodePort == 0 {
		return nil
	}
	if svc.Affinity != nil {
		st.affinity = max(svc.Affinity.TimeoutSeconds, 1)
	}
	st.internal = pool{buckets: buckets(f, svc.Endpoints, svc.InternalLocal)}
	st.external = pool{buckets: buckets(f, svc.Endpoints, svc.ExternalLocal)}
	if svc.ExternalLocal {
		st.cluster = pool{buckets: buckets(f, svc.Endpoints, false)}
	}
	st.hasEndpoints = slices.ContainsFunc(svc.Endpoints, func(e plan.Endpoint) bool { return f.is(e.Address) })
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
// by their greatest common divisor and capped at maxBuckets.
func buckets(f *family, eps []plan.Endpoint, local bool) []netip.AddrPort {
	var weights []uint64
	var addrs []netip.AddrPort
	for _, e := range eps {
		if e.Weight == 0 || !f.is(e.Address) || (local && !e.ForLocal) || (!local && !e.ForCluster) {
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

// clusterIPs returns the state's cluster IPs of the family; none for nil.
// Each one counts a reference to its element of the cluster-ips set.
func (s *serviceState) clusterIPs() []netip.Addr {
	if s == nil {
		return nil
	}
	return s.ips
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
		slices.Equal(a.extIPs, b.extIPs) && a.affinity == b.affinity &&
		slices.Equal(a.lbIPs, b.lbIPs) && slices.Equal(a.ranges, b.ranges) &&
		a.externalLocal == b.externalLocal && a.internalLocal == b.internalLocal && a.hasEndpoints == b.hasEndpoints &&
		a.internal.weight() == b.internal.weight() && a.external.weight() == b.external.weight() &&
		a.cluster.weight() == b.cluster.weight()
}

// draw is what a goto element sends its key's packets to: a chain of kind
// that draws an endpoint of pool.
type draw struct {
	kind pickKind
	key  []byte
	pool pool
}

// entrySink receives one entry element; d is set for the goto elements.
type entrySink func(set string, e element, d *draw)

// chainFor returns the chain a draw's goto element names: the service's
// own sticky chain with ClientIP affinity, the shared pick chain otherwise.
func (s *serviceState) chainFor(kind pickKind, p pool) string {
	if s.affinity > 0 {
		return stickyChain(kind, s.key)
	}
	return pickSpec{kind: kind, weight: p.weight()}.chain()
}

// gotoDraw appends the goto element of key to set.
func (s *serviceState) gotoDraw(add entrySink, set string, key []byte, p pool, kind pickKind) {
	add(set, gotoElement(key, s.chainFor(kind, p)), &draw{kind: kind, key: key, pool: p})
}

// entryElements returns the elements that send the service's addresses to
// their pick chains; an empty pool's addresses go to the drop sets when the
// service has endpoints elsewhere, to the reject sets when it has none.
func (s *serviceState) entryElements(add entrySink) {
	ext, extPort := pickExternal, pickNodePort
	if s.externalLocal {
		ext, extPort = pickExternalLocal, pickNodePortLocal
	}
	for _, ip := range s.ips {
		s.ipEntry(add, ipKey(ip, s.proto, s.port), s.internal, pickCluster)
	}
	for _, ip := range s.extIPs {
		s.ipEntry(add, ipKey(ip, s.proto, s.port), s.external, ext)
	}
	for _, ip := range s.lbIPs {
		add(setFirewallIPs, element{Key: ipKey(ip, s.proto, s.port)}, nil)
		for _, r := range s.ranges {
			add(setFirewallAllow, allowElement(ip, s.proto, s.port, r), nil)
		}
	}
	s.shortCircuitEntries(add)
	if s.nodePort == 0 {
		return
	}
	key := portKey(s.proto, s.nodePort)
	switch {
	case s.external.weight() > 0:
		s.gotoDraw(add, setNodePorts, key, s.external, extPort)
	case s.hasEndpoints:
		add(setDropNodePorts, element{Key: key}, nil)
	default:
		add(setNoEPNodePorts, element{Key: key}, nil)
	}
}

// shortCircuitEntries sends node- and pod-originated traffic for a Local
// policy service's external addresses to the cluster's endpoints, whatever
// the internal policy, as kube-proxy does.
func (s *serviceState) shortCircuitEntries(add entrySink) {
	in := s.cluster
	if !s.externalLocal || in.weight() == 0 {
		return
	}
	for _, ip := range s.extIPs {
		s.gotoDraw(add, setShortIPs, ipKey(ip, s.proto, s.port), in, pickShortIP)
	}
	if s.nodePort != 0 {
		s.gotoDraw(add, setShortNodePorts, portKey(s.proto, s.nodePort), in, pickShortNP)
	}
}

func (s *serviceState) ipEntry(add entrySink, key []byte, p pool, kind pickKind) {
	// The refuse and drop sets treat cluster and external IPs alike; the
	// comment tells them apart for ReadBack.
	unserved := element{Key: key}
	if kind != pickCluster {
		unserved.Comment = externalComment
	}
	switch {
	case p.weight() > 0:
		s.gotoDraw(add, setServiceIPs, key, p, kind)
	case s.hasEndpoints:
		add(setDropIPs, unserved, nil)
	default:
		add(setNoEPIPs, unserved, nil)
	}
}

// externalComment marks the element of an external or load-balancer IP in
// the refuse and drop sets.
const externalComment = "external"

// draws returns the goto elements' draws, in entry order.
func (s *serviceState) draws() []draw {
	var out []draw
	if s != nil {
		s.entryElements(func(_ string, _ element, d *draw) {
			if d != nil {
				out = append(out, *d)
			}
		})
	}
	return out
}

// bucketElements returns the elements of the given buckets in the draw's
// endpoints map.
func (d draw) bucketElements(idx []int) []element {
	out := make([]element, 0, len(idx))
	for _, i := range idx {
		out = append(out, bucketElement(d.key, uint32(i), d.pool.buckets[i]))
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
// the same weight.
func changedBuckets(old, cur pool) []int {
	var idx []int
	for i := range cur.buckets {
		if old.buckets[i] != cur.buckets[i] {
			idx = append(idx, i)
		}
	}
	return idx
}
