package nftables

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// maxBuckets bounds the buckets (map elements) of one service; weights whose
// reduced sum exceeds it are scaled down proportionally.
const maxBuckets = 4096

// serviceState is what the backend wrote to the kernel for one service port.
type serviceState struct {
	target   uint32
	proto    plan.Protocol
	port     uint16
	nodePort uint16
	ips      []netip.Addr
	// buckets holds the endpoint of every bucket; its length is the service's
	// total weight W, zero when the service has no usable endpoint.
	buckets []netip.AddrPort
}

func (s *serviceState) weight() uint32 { return uint32(len(s.buckets)) }

// newServiceState computes the state a plan service needs, or nil when the
// service has nothing this backend can program (no IPv4 address, no node port).
func newServiceState(svc *plan.Service, target uint32) *serviceState {
	if _, err := protoNumber(svc.Key.Protocol); err != nil {
		return nil
	}
	st := &serviceState{target: target, proto: svc.Key.Protocol, port: svc.Port, nodePort: svc.NodePort}
	for _, ip := range svc.ClusterIPs {
		if ip.Is4() {
			st.ips = append(st.ips, ip)
		}
	}
	if len(st.ips) == 0 && st.nodePort == 0 {
		return nil
	}
	st.buckets = buckets(svc.Endpoints)
	return st
}

// buckets spreads endpoints over buckets in proportion to their weights,
// reduced by their greatest common divisor and capped at maxBuckets.
func buckets(eps []plan.Endpoint) []netip.AddrPort {
	var weights []uint64
	var addrs []netip.AddrPort
	for _, e := range eps {
		if e.Weight == 0 || !e.ForCluster || !e.Address.Is4() {
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
	if s == nil {
		return nil
	}
	var out []netip.Addr
	for _, b := range s.buckets {
		if !slices.Contains(out, b.Addr()) {
			out = append(out, b.Addr())
		}
	}
	return out
}

// sameEntries reports whether both states route the same keys the same way.
func sameEntries(a, b *serviceState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.target == b.target && a.proto == b.proto && a.port == b.port && a.nodePort == b.nodePort &&
		a.weight() == b.weight() && slices.Equal(a.ips, b.ips)
}

// entryElements returns the elements that send the service's addresses to its
// pick chain, or to the reject sets when it has no endpoints.
func (s *serviceState) entryElements(add func(set string, e element)) {
	w := s.weight()
	for _, ip := range s.ips {
		key := ipKey(ip, s.proto, s.port)
		if w == 0 {
			add(setNoEPIPs, element{Key: key})
			continue
		}
		add(setServiceIPs, gotoElement(key, pickIPChain(w)))
		add(setIPTargets, targetElement(key, s.target))
	}
	if s.nodePort == 0 {
		return
	}
	key := portKey(s.proto, s.nodePort)
	if w == 0 {
		add(setNoEPNodePorts, element{Key: key})
		return
	}
	add(setNodePorts, gotoElement(key, pickNPChain(w)))
	add(setNPTargets, targetElement(key, s.target))
}

// bucketElements returns the endpoints-W elements of the given buckets.
func (s *serviceState) bucketElements(idx []int) []element {
	out := make([]element, 0, len(idx))
	for _, i := range idx {
		out = append(out, bucketElement(s.target, uint32(i), s.buckets[i]))
	}
	return out
}

func allBuckets(s *serviceState) []int {
	idx := make([]int, len(s.buckets))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// changedBuckets returns the buckets whose endpoint differs between states of
// the same target and weight.
func changedBuckets(old, cur *serviceState) []int {
	var idx []int
	for i := range cur.buckets {
		if old.buckets[i] != cur.buckets[i] {
			idx = append(idx, i)
		}
	}
	return idx
}
