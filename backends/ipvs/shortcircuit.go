package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// The short circuit. kube-proxy sends the connections that the node
// itself, or a pod it recognises, opens to the external addresses of an
// externalTrafficPolicy Local service (external and load-balancer IPs,
// node ports) to the cluster's endpoints, as if they had left through
// the load balancer and come back; Local alone would refuse them on a
// node without local endpoints. IPVS picks a virtual server by
// destination only, so such a service gets, per family, one
// firewall-mark virtual server holding its cluster endpoints, and one
// mangle rule per external destination marks node and pod packets for
// it: IPVS looks marks up before addresses. (kube-proxy's own IPVS mode
// lacks this; see kubernetes/kubernetes#93456.)
//
// Marks come from one range that IPVS matches exactly, so no other bit
// may be set on those packets: the nat layer leaves them without the
// masquerade bit and masquerades the node's own in POSTROUTING by
// source address type instead.
const (
	// markBase is the first mark; marks run up to markBase+markCount-1.
	markBase  = 0x10000
	markCount = 0x10000
	// markMatch matches every mark of the range in iptables.
	markMatch = "0x10000/0xffff0000"
)

// markRule sends node and pod traffic to one external destination to the
// firewall-mark virtual servers of mark.
type markRule struct {
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
	mark  uint32
}

func (r markRule) compare(o markRule) int {
	return vsKey(r).compare(vsKey(o))
}

// needsMark reports whether svc short-circuits: its external policy is
// Local and it has external destinations. Its internal policy does not
// matter: the short circuit goes to the cluster's endpoints either way.
func needsMark(svc *plan.Service) bool {
	return svc != nil && svc.ExternalLocal &&
		(svc.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0)
}

// shortCircuit adds the firewall-mark virtual server of each family that
// has external destinations and cluster endpoints taking connections, and
// the rules marking those destinations.
func (st *serviceState) shortCircuit(svc *plan.Service, sched string, persistence uint32, mark uint32) {
	for _, k := range st.keys() {
		if isClusterIP(svc, k) {
			continue
		}
		f := familyOf(k.addr)
		mk := markKey(mark, f)
		if _, ok := st.servers[mk]; !ok {
			vs := newVirtualServer(sched, persistence)
			vs.reals = realServers(svc.Endpoints, false, f == 4)
			if !vs.accepts() {
				continue
			}
			st.servers[mk] = vs
		}
		st.marks = append(st.marks, markRule{addr: k.addr, proto: k.proto, port: k.port, mark: mark})
	}
}

// isClusterIP reports whether the virtual server k is one of svc's
// cluster IPs on its port.
func isClusterIP(svc *plan.Service, k vsKey) bool {
	return k.mark == 0 && k.port == svc.Port && slices.ContainsFunc(svc.ClusterIPs, func(a netip.Addr) bool { return a.Unmap() == k.addr })
}

// marks hands out one mark per short-circuiting service and keeps it
// while the service needs it.
type marks struct {
	byKey map[plan.Key]uint32
	used  map[uint32]bool
}

func newMarks() *marks { return &marks{byKey: map[plan.Key]uint32{}, used: map[uint32]bool{}} }

// forService returns svc's mark, allocating the lowest free one, when it
// needs one (0 otherwise, and when all are taken); a service that no
// longer needs its mark gives it back.
func (m *marks) forService(key plan.Key, svc *plan.Service) uint32 {
	if !needsMark(svc) {
		m.release(key)
		return 0
	}
	if v, ok := m.byKey[key]; ok {
		return v
	}
	for v := uint32(markBase); v < markBase+markCount; v++ {
		if !m.used[v] {
			m.used[v], m.byKey[key] = true, v
			return v
		}
	}
	return 0
}

func (m *marks) release(key plan.Key) {
	if v, ok := m.byKey[key]; ok {
		delete(m.used, v)
		delete(m.byKey, key)
	}
}

// inMarkRange reports whether mark is one Weir hands out.
func inMarkRange(mark uint32) bool { return mark >= markBase && mark < markBase+markCount }

// renderMangle returns the mangle table of family f: node traffic, and
// pod traffic as the local traffic detector recognises it, to a Local
// service's external destination goes to chainShortCircuit, where one
// rule per destination of rules sets its service's mark; and
// chainNodeFirewall checks the node's own connections against source
// ranges.
func renderMangle(f int, o *backends.Common, node plan.Node, rules []markRule) string {
	var b strings.Builder
	b.WriteString("*mangle\n")
	for _, c := range layerChains[2].chains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	fmt.Fprintf(&b, "-A %s %s\n", chainNodeFirewall, firewallDrop(f))
	toLocal := "-m set --match-set " + familySet(setExternalLocal, f) + " dst,dst -j " + chainShortCircuit
	pods, _ := podMatches(f, o, node)
	for _, m := range pods {
		fmt.Fprintf(&b, "-A %s %s %s\n", chainMarkPods, m, toLocal)
	}
	fmt.Fprintf(&b, "-A %s %s\n", chainMarkNode, toLocal)
	for _, r := range rules {
		if familyOf(r.addr) != f {
			continue
		}
		proto := strings.ToLower(string(r.proto))
		fmt.Fprintf(&b, "-A %s -d %s -p %s -m %s --dport %d -j MARK --set-xmark %#x/0xffffffff\n",
			chainShortCircuit, netip.PrefixFrom(r.addr, r.addr.BitLen()), proto, proto, r.port, r.mark)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
