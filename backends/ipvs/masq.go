package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// The ipsets of the masquerade layer, all hash sets holding one address
// family each: the IPv6 set's name adds setSuffix6.
//
// Node ports are not kept as kube-proxy's port bitmaps matched with
// --dst-type LOCAL: the kernel's bitmap:port rejects the protocol
// attribute vishvananda/netlink always sends with a port (and matches TCP
// and UDP only). Weir's node ports are virtual servers on known addresses
// anyway, so they go into setExternal by address.
const (
	// setClusterIP holds cluster IP, protocol and port of every service.
	setClusterIP = "WEIR-IPVS-CLUSTER-IP"
	// setExternal holds every other destination with protocol and port:
	// external IPs, load-balancer IPs, and node-port addresses with their
	// node ports.
	setExternal = "WEIR-IPVS-EXTERNAL"
	// setExternalLocal holds the entries of setExternal whose service has
	// externalTrafficPolicy Local: they keep the client's address.
	setExternalLocal = "WEIR-IPVS-EXTERNAL-LOCAL"
	// setHairpin holds endpoint, protocol and port, endpoint: an endpoint
	// reaching itself through a service.
	setHairpin = "WEIR-IPVS-HAIRPIN"
	// setDrop holds the destinations whose traffic policy is Local and
	// whose service has endpoints, none of them on this node: new
	// connections are dropped (IPVS would refuse them).
	setDrop = "WEIR-IPVS-DROP"
	// setFirewall holds the load-balancer destinations of services with
	// loadBalancerSourceRanges.
	setFirewall = "WEIR-IPVS-FIREWALL"
	// setSourceRanges holds load-balancer IP, protocol and port, allowed
	// source range: what setFirewall's destinations accept. When a range
	// holds the node's IP, each load-balancer IP of the service is an
	// allowed source too: the node's own connections to an address on
	// Weir's interface leave from that address.
	setSourceRanges = "WEIR-IPVS-SOURCE-RANGES"
	// setSuffix6 ends the names of the IPv6 sets.
	setSuffix6 = "-6"
)

// setSpec describes one ipset: its name, type and family (4 or 6).
type setSpec struct {
	name   string
	kind   string
	family int
}

// allSets lists every set of the masquerade layer, in creation order.
func allSets() []setSpec {
	var out []setSpec
	for _, f := range []int{4, 6} {
		out = append(out,
			setSpec{familySet(setClusterIP, f), "hash:ip,port", f},
			setSpec{familySet(setExternal, f), "hash:ip,port", f},
			setSpec{familySet(setExternalLocal, f), "hash:ip,port", f},
			setSpec{familySet(setHairpin, f), "hash:ip,port,ip", f},
			setSpec{familySet(setDrop, f), "hash:ip,port", f},
			setSpec{familySet(setFirewall, f), "hash:ip,port", f},
			setSpec{familySet(setSourceRanges, f), kindIPPortNet, f})
	}
	return out
}

func familySet(name string, f int) string {
	if f == 6 {
		return name + setSuffix6
	}
	return name
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// kindIPPortNet is the type of the sets whose third part is a network.
const kindIPPortNet = "hash:ip,port,net"

// setEntry is one member of one set; addr2 is set only in the hairpin
// and source-range sets, bits2 (addr2's prefix length) only in the latter.
type setEntry struct {
	set   string
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
	addr2 netip.Addr
	bits2 uint8
}

// String formats the entry as the ipset tool lists it, after the set name.
func (e setEntry) String() string {
	s := fmt.Sprintf("%s %s,%s:%d", e.set, e.addr, e.proto, e.port)
	if e.addr2.IsValid() {
		s += "," + e.addr2.String()
	}
	if e.bits2 > 0 {
		s += fmt.Sprintf("/%d", e.bits2)
	}
	return s
}

func (e setEntry) compare(o setEntry) int {
	return cmp.Or(cmp.Compare(e.set, o.set), e.addr.Compare(o.addr), cmp.Compare(e.proto, o.proto),
		cmp.Compare(e.port, o.port), e.addr2.Compare(o.addr2), cmp.Compare(e.bits2, o.bits2))
}

// masqEntries returns the set entries one service needs for the virtual
// servers it owns (st, after claim): each virtual server is a cluster IP,
// a node port or an external (or load-balancer) IP, and each real server
// may reach itself through it. node is the plan's node, whose IPs decide
// whether the node's own connections pass source ranges.
func masqEntries(svc *plan.Service, st *serviceState, node plan.Node) []setEntry {
	if svc == nil || st == nil {
		return nil
	}
	var out []setEntry
	add := func(e setEntry) {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	for _, k := range st.keys() {
		if k.mark == 0 {
			for _, e := range destEntries(svc, k) {
				add(e)
			}
			for _, e := range filterEntries(svc, k, st.servers[k], backends.NodeIP(node, k.addr.Is6())) {
				add(e)
			}
		}
		for r := range st.servers[k].reals {
			a := r.Addr()
			add(setEntry{set: familySet(setHairpin, familyOf(a)), addr: a, proto: svc.Key.Protocol, port: r.Port(), addr2: a})
		}
	}
	slices.SortFunc(out, setEntry.compare)
	return out
}

// destEntries returns the entries saying what kind of destination the
// virtual server k of svc is: a cluster IP, or any other (external or
// load-balancer IP, node port), also marked Local under
// externalTrafficPolicy Local.
func destEntries(svc *plan.Service, k vsKey) []setEntry {
	f := familyOf(k.addr)
	if isClusterIP(svc, k) {
		return []setEntry{{set: familySet(setClusterIP, f), addr: k.addr, proto: k.proto, port: k.port}}
	}
	out := []setEntry{{set: familySet(setExternal, f), addr: k.addr, proto: k.proto, port: k.port}}
	if svc.ExternalLocal {
		out = append(out, setEntry{set: familySet(setExternalLocal, f), addr: k.addr, proto: k.proto, port: k.port})
	}
	return out
}

// filterEntries returns the entries the filter rules need for the virtual
// server k of svc: a drop entry when k has no real server to send new
// connections to although svc has endpoints of k's family (elsewhere, as
// its traffic policy is Local), and the firewall entries of a
// load-balancer IP with source ranges (backends.NodeSources adds the
// load-balancer IPs when one holds nodeIP, the node's IP of k's family). A
// service without any endpoint of the family needs no drop entry: IPVS
// refuses its connections itself.
func filterEntries(svc *plan.Service, k vsKey, vs *virtualServer, nodeIP netip.Addr) []setEntry {
	f := familyOf(k.addr)
	var out []setEntry
	if !vs.accepts() && slices.ContainsFunc(svc.Endpoints, func(e plan.Endpoint) bool { return familyOf(e.Address.Unmap()) == f }) {
		out = append(out, setEntry{set: familySet(setDrop, f), addr: k.addr, proto: k.proto, port: k.port})
	}
	if len(svc.SourceRanges) == 0 || k.port != svc.Port || !slices.ContainsFunc(svc.LoadBalancerIPs, func(a netip.Addr) bool { return a.Unmap() == k.addr }) {
		return out
	}
	var allowed []setEntry
	for _, r := range append(slices.Clone(svc.SourceRanges), backends.NodeSources(svc, nodeIP)...) {
		a := r.Addr().Unmap()
		if familyOf(a) != f {
			continue
		}
		bits := r.Bits() - (r.Addr().BitLen() - a.BitLen()) // a mapped range's length, unmapped
		if bits <= 0 {
			return out // the whole family is allowed (hash:net cannot hold /0)
		}
		r = netip.PrefixFrom(a, bits).Masked()
		allowed = append(allowed, setEntry{set: familySet(setSourceRanges, f), addr: k.addr, proto: k.proto, port: k.port,
			addr2: r.Addr(), bits2: uint8(r.Bits())})
	}
	out = append(out, setEntry{set: familySet(setFirewall, f), addr: k.addr, proto: k.proto, port: k.port})
	return append(out, allowed...)
}
