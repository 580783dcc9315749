package ipvs

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// maxWeight caps an IPVS weight; it is what ipvsadm accepts, and ample
// for proportions.
const maxWeight = 65535

// vsKey identifies one IPVS virtual server: an address, protocol and port,
// or a firewall mark (then addr is the unspecified address of the
// family, and proto and port are empty: the kernel keeps neither).
type vsKey struct {
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
	mark  uint32
}

// markKey returns the key of the firewall-mark virtual server of family
// f (4 or 6).
func markKey(mark uint32, f int) vsKey {
	if f == 4 {
		return vsKey{addr: netip.IPv4Unspecified(), mark: mark}
	}
	return vsKey{addr: netip.IPv6Unspecified(), mark: mark}
}

// String formats the key as ipvsadm lists it, e.g. "TCP 10.96.0.10:80"
// or "FWM 65537 IPv6".
func (k vsKey) String() string {
	if k.mark != 0 {
		return fmt.Sprintf("FWM %d IPv%d", k.mark, familyOf(k.addr))
	}
	return string(k.proto) + " " + netip.AddrPortFrom(k.addr, k.port).String()
}

func (k vsKey) compare(o vsKey) int {
	return cmp.Or(k.addr.Compare(o.addr), cmp.Compare(k.proto, o.proto), cmp.Compare(k.port, o.port), cmp.Compare(k.mark, o.mark))
}

// graceful reports whether a removed real server of this virtual server
// keeps its connections until they end. UDP and SCTP real servers are
// deleted at once; with expire_nodest_conn their flows move on with the
// next packet (as kube-proxy does). Firewall-mark virtual servers do not
// know their protocol and always drain.
func (k vsKey) graceful() bool { return k.proto == plan.TCP || k.mark != 0 }

// virtualServer is one virtual server as wanted or as programmed.
type virtualServer struct {
	scheduler string
	// persistence is the ClientIP affinity timeout in seconds; 0 for none.
	persistence uint32
	// reals maps each real server to its IPVS weight.
	reals map[netip.AddrPort]int32
	// draining holds, in programmed state only, the real servers kept at
	// weight 0 until their connections end, with when draining began.
	draining map[netip.AddrPort]time.Time
}

func newVirtualServer(scheduler string, persistence uint32) *virtualServer {
	return &virtualServer{scheduler: scheduler, persistence: persistence,
		reals: map[netip.AddrPort]int32{}, draining: map[netip.AddrPort]time.Time{}}
}

// accepts reports whether some real server takes new connections (has a
// positive weight).
func (v *virtualServer) accepts() bool {
	for _, w := range v.reals {
		if w > 0 {
			return true
		}
	}
	return false
}

// sameConfig reports whether v and o have the same scheduler and persistence.
func (v *virtualServer) sameConfig(o *virtualServer) bool {
	return v.scheduler == o.scheduler && v.persistence == o.persistence
}

// String formats the virtual server's settings and real servers in a
// stable order, for tests and logs.
func (v *virtualServer) String() string {
	s := v.scheduler
	if v.persistence > 0 {
		s += fmt.Sprintf(" persistent %ds", v.persistence)
	}
	for _, a := range slices.SortedFunc(maps.Keys(v.reals), netip.AddrPort.Compare) {
		s += fmt.Sprintf(" %s w%d", a, v.reals[a])
		if _, ok := v.draining[a]; ok {
			s += " draining"
		}
	}
	return s
}

// serviceState is what one plan service needs: its virtual servers and
// the addresses it puts on the dummy interface.
type serviceState struct {
	servers map[vsKey]*virtualServer
	addrs   []netip.Addr
	// entries are the ipset entries of the masquerade layer it needs.
	entries []setEntry
	// marks are the destinations whose node and pod traffic goes to the
	// service's firewall-mark virtual servers, with the mark.
	marks []markRule
	// ranged is set when entries depend on the node's IP (isRanged).
	ranged bool
}

// keys returns the service's virtual server keys in order.
func (s *serviceState) keys() []vsKey {
	if s == nil {
		return nil
	}
	return slices.SortedFunc(maps.Keys(s.servers), vsKey.compare)
}

// desiredService computes the virtual servers of one plan service: one per
// cluster IP, external IP and load-balancer IP on the service port, one
// per node-port address on the node port, and with a mark (see
// needsMark) the short-circuit virtual servers. It returns nil when the
// service needs nothing (e.g. an unsupported protocol).
func desiredService(svc *plan.Service, nodePortAddrs []netip.Addr, defaultScheduler string, mark uint32) *serviceState {
	if svc == nil || protoNumber(svc.Key.Protocol) == 0 {
		return nil
	}
	st := &serviceState{servers: map[vsKey]*virtualServer{}}
	sched := schedulerFor(svc, defaultScheduler)
	var persistence uint32
	if svc.Affinity != nil {
		persistence = max(svc.Affinity.TimeoutSeconds, 1)
	}
	add := func(a netip.Addr, port uint16, local bool) {
		a = a.Unmap()
		k := vsKey{addr: a, proto: svc.Key.Protocol, port: port}
		if !a.IsValid() || port == 0 || st.servers[k] != nil {
			return
		}
		vs := newVirtualServer(sched, persistence)
		vs.reals = realServers(svc.Endpoints, local, a.Is4())
		st.servers[k] = vs
	}
	for _, a := range svc.ClusterIPs {
		add(a, svc.Port, svc.InternalLocal)
	}
	for _, a := range slices.Concat(svc.ExternalIPs, svc.LoadBalancerIPs) {
		add(a, svc.Port, svc.ExternalLocal)
	}
	for _, a := range slices.Concat(svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs) {
		if a = a.Unmap(); a.IsValid() && !slices.Contains(st.addrs, a) {
			st.addrs = append(st.addrs, a)
		}
	}
	if svc.NodePort != 0 {
		for _, a := range nodePortAddrs {
			if servesFamily(svc, a) {
				add(a, svc.NodePort, svc.ExternalLocal)
			}
		}
	}
	if mark != 0 {
		st.shortCircuit(svc, sched, persistence, mark)
	}
	if len(st.servers) == 0 {
		return nil
	}
	return st
}

// servesFamily reports whether the service has a cluster IP of a's family
// (or no cluster IP at all): a single-stack service gets node ports only
// in its own family.
func servesFamily(svc *plan.Service, a netip.Addr) bool {
	return len(svc.ClusterIPs) == 0 || slices.ContainsFunc(svc.ClusterIPs, func(c netip.Addr) bool { return c.Unmap().Is4() == a.Is4() })
}

// schedulerFor returns the service's scheduler hint when the backend
// knows it, else the default.
func schedulerFor(svc *plan.Service, def string) string {
	if s := string(svc.Scheduler); s != "" && slices.Contains(Schedulers, s) {
		return s
	}
	return def
}

// realServers returns the endpoints of one family that serve one traffic
// policy (the node's own under Local, the cluster's under Cluster), with
// their scaled weights. Endpoints of weight 0 stay, at weight 0: they take
// no new connections but keep their established ones.
func realServers(eps []plan.Endpoint, local, v4 bool) map[netip.AddrPort]int32 {
	var addrs []netip.AddrPort
	var weights []uint32
	for _, e := range eps {
		a := e.Address.Unmap()
		if a.Is4() != v4 || (local && !e.ForLocal) || (!local && !e.ForCluster) {
			continue
		}
		ap := netip.AddrPortFrom(a, e.Port)
		if slices.Contains(addrs, ap) {
			continue
		}
		addrs = append(addrs, ap)
		weights = append(weights, e.Weight)
	}
	out := make(map[netip.AddrPort]int32, len(addrs))
	for i, w := range scaleWeights(weights) {
		out[addrs[i]] = w
	}
	return out
}

// scaleWeights turns plan weights into IPVS weights with the same
// proportions: divided by the greatest common divisor of the positive
// weights (so 1:1 stays 1:1 and 100:300 becomes 1:3), then, if the largest
// still exceeds maxWeight, scaled down to it, with every positive weight
// kept at least 1. Zero stays zero.
func scaleWeights(ws []uint32) []int32 {
	var g, top uint64
	for _, w := range ws {
		if w > 0 {
			g = gcd(g, uint64(w))
			top = max(top, uint64(w))
		}
	}
	out := make([]int32, len(ws))
	if g == 0 {
		return out
	}
	top /= g
	for i, w := range ws {
		x := uint64(w) / g
		if top > maxWeight && x > 0 {
			x = max(1, (x*maxWeight+top/2)/top)
		}
		out[i] = int32(x)
	}
	return out
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
