package iptables

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// ipFamily selects IPv4 or IPv6 services/endpoints.
type ipFamily int

// The IP families; each has its own tables (iptables, ip6tables).
const (
	ipv4 ipFamily = 4
	ipv6 ipFamily = 6
)

// has says whether a belongs to the family.
func (f ipFamily) has(a netip.Addr) bool { return a.Is4() == (f == ipv4) && a.IsValid() }

// loopback returns the family's loopback range.
func (f ipFamily) loopback() netip.Prefix {
	if f == ipv6 {
		return netip.MustParsePrefix("::1/128")
	}
	return netip.MustParsePrefix("127.0.0.0/8")
}

// member is one endpoint of a pool with its weight (> 0).
type member struct {
	ep     netip.AddrPort
	weight uint64
}

// extAddr is an external or load-balancer IP of a service.
type extAddr struct {
	ip netip.Addr
	// lb is set for load-balancer ingress IPs that are not also external IPs.
	lb bool
	// ranged is set when loadBalancerSourceRanges limit who may use it.
	ranged bool
}

// svcModel is what one service port needs in one family, decided as the
// nftables backend does (newServiceState): which addresses it has there,
// which endpoints serve each traffic policy, and whether it has endpoints
// at all (reject) or only none for some traffic (drop).
type svcModel struct {
	key      plan.Key
	portName string // "ns/name:port", the rules' comment
	proto    string // "tcp", "udp", "sctp"
	port     uint16
	nodePort uint16
	hcPort   uint16

	clusterIPs []netip.Addr
	extIPs     []extAddr
	// ranges are the source ranges of this family, and each load-balancer
	// IP as a source when one of them holds the node's IP (as kube-proxy's
	// allowFromNode); a service with ranges only of the other family closes
	// its load-balancer IPs here.
	ranges []netip.Prefix

	// affinity is the ClientIP affinity timeout in seconds, 0 for none.
	affinity uint32
	// cluster and local are the endpoints serving the Cluster and the Local
	// traffic policy (ForCluster / ForLocal, weight > 0, this family).
	cluster, local []member
	internalLocal  bool
	externalLocal  bool
	// hasEndpoints is set when the service has any endpoint of this family;
	// an empty pool then drops instead of rejecting.
	hasEndpoints bool
}

// newModel returns the model of svc in family f, where the node's IP is
// nodeIP (backends.NodeIP), or nil when the service has nothing there (no
// address of the family and no node port) or an unknown protocol.
func newModel(svc *plan.Service, f ipFamily, nodeIP netip.Addr) *svcModel {
	if svc == nil {
		return nil
	}
	switch svc.Key.Protocol {
	case plan.TCP, plan.UDP, plan.SCTP:
	default:
		return nil
	}
	m := &svcModel{
		key: svc.Key, portName: servicePortName(svc.Key), proto: protoName(svc.Key.Protocol),
		port: svc.Port, nodePort: svc.NodePort, internalLocal: svc.InternalLocal, externalLocal: svc.ExternalLocal,
		clusterIPs: addrsOf(f, svc.ClusterIPs),
	}
	m.extIPs = extAddrs(f, svc)
	if len(m.clusterIPs) == 0 && len(m.extIPs) == 0 && m.nodePort == 0 {
		return nil
	}
	for _, r := range append(slices.Clone(svc.SourceRanges), backends.NodeSources(svc, nodeIP)...) {
		if f.has(r.Addr()) && !slices.Contains(m.ranges, r.Masked()) {
			m.ranges = append(m.ranges, r.Masked())
		}
	}
	if svc.ExternalLocal {
		m.hcPort = svc.HealthCheckNodePort
	}
	if svc.Affinity != nil {
		m.affinity = max(svc.Affinity.TimeoutSeconds, 1)
	}
	m.cluster = poolOf(f, svc.Endpoints, false)
	m.local = poolOf(f, svc.Endpoints, true)
	m.hasEndpoints = slices.ContainsFunc(svc.Endpoints, func(e plan.Endpoint) bool { return f.has(e.Address) })
	return m
}

// ranged reports whether the model has load-balancer IPs limited by source
// ranges: its rules then depend on the node's IP.
func (m *svcModel) ranged() bool {
	return slices.ContainsFunc(m.extIPs, func(e extAddr) bool { return e.ranged })
}

// addrsOf returns the distinct addresses of family f.
func addrsOf(f ipFamily, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if f.has(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// extAddrs returns the distinct external and load-balancer IPs of family f.
// With source ranges, every load-balancer IP is limited by them, even one
// that is also an external IP (as in the nftables backend).
func extAddrs(f ipFamily, svc *plan.Service) []extAddr {
	var out []extAddr
	ranged := len(svc.SourceRanges) > 0
	for _, ip := range addrsOf(f, svc.ExternalIPs) {
		out = append(out, extAddr{ip: ip, ranged: ranged && slices.Contains(svc.LoadBalancerIPs, ip)})
	}
	for _, ip := range addrsOf(f, svc.LoadBalancerIPs) {
		if !slices.Contains(svc.ExternalIPs, ip) {
			out = append(out, extAddr{ip: ip, lb: true, ranged: ranged})
		}
	}
	return out
}

// poolOf returns the endpoints of family f serving one traffic policy,
// drained ones (weight 0) left out; an address and port listed twice counts
// once with the weights added.
func poolOf(f ipFamily, eps []plan.Endpoint, local bool) []member {
	out := make([]member, 0, len(eps))
	for _, e := range eps {
		if e.Weight == 0 || !f.has(e.Address) || (local && !e.ForLocal) || (!local && !e.ForCluster) {
			continue
		}
		ap := e.AddrPort()
		if i := slices.IndexFunc(out, func(m member) bool { return m.ep == ap }); i >= 0 {
			out[i].weight += uint64(e.Weight)
			continue
		}
		out = append(out, member{ep: ap, weight: uint64(e.Weight)})
	}
	return out
}

// routing is how a service's traffic flows through its chains.
type routing struct {
	names serviceChains
	// internal is the chain cluster-IP traffic goes to (KUBE-SVC or
	// KUBE-SVL), "" when that traffic has no endpoint.
	internal string
	// useSVC, useSVL, useEXT and useFW say which chains exist.
	useSVC, useSVL, useEXT, useFW bool
	// shortCircuit sends node and pod traffic for the external addresses
	// of a Local-policy service to the cluster endpoints (KUBE-SVC).
	shortCircuit bool
	// externalPool is the pool of external traffic (cluster or local).
	externalPool []member
}

// route decides the service's chains, following the nftables backend.
func (m *svcModel) route() routing {
	r := routing{names: chainsFor(m.portName, m.proto)}
	internal, internalName := m.cluster, r.names.svc
	if m.internalLocal {
		internal, internalName = m.local, r.names.svl
	}
	r.externalPool = m.cluster
	if m.externalLocal {
		r.externalPool = m.local
	}
	if len(internal) > 0 && len(m.clusterIPs) > 0 {
		r.internal = internalName
	}
	external := len(m.extIPs) > 0 || m.nodePort != 0
	r.shortCircuit = external && m.externalLocal && len(m.cluster) > 0
	r.useSVC = r.internal == r.names.svc || r.shortCircuit || (external && !m.externalLocal && len(m.cluster) > 0)
	r.useSVL = r.internal == r.names.svl || (external && m.externalLocal && len(m.local) > 0)
	r.useEXT = external && (len(r.externalPool) > 0 || r.shortCircuit)
	r.useFW = r.useEXT && slices.ContainsFunc(m.extIPs, func(e extAddr) bool { return e.ranged })
	return r
}
