package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

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
			setSpec{familySet(setHairpin, f), "hash:ip,port,ip", f})
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

// setEntry is one member of one set; addr2 is set only in the hairpin
// sets.
type setEntry struct {
	set   string
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
	addr2 netip.Addr
}

// String formats the entry as the ipset tool lists it, after the set name.
func (e setEntry) String() string {
	s := fmt.Sprintf("%s %s,%s:%d", e.set, e.addr, e.proto, e.port)
	if e.addr2.IsValid() {
		s += "," + e.addr2.String()
	}
	return s
}

func (e setEntry) compare(o setEntry) int {
	return cmp.Or(cmp.Compare(e.set, o.set), e.addr.Compare(o.addr), cmp.Compare(e.proto, o.proto),
		cmp.Compare(e.port, o.port), e.addr2.Compare(o.addr2))
}

// masqEntries returns the set entries one service needs for the virtual
// servers it owns (st, after claim): each virtual server is a cluster IP,
// a node port or an external (or load-balancer) IP, and each real server
// may reach itself through it.
func masqEntries(svc *plan.Service, st *serviceState) []setEntry {
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
		for _, e := range destEntries(svc, k) {
			add(e)
		}
		for r := range st.servers[k].reals {
			a := r.Addr()
			add(setEntry{set: familySet(setHairpin, familyOf(a)), addr: a, proto: k.proto, port: r.Port(), addr2: a})
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
	if k.port == svc.Port && slices.ContainsFunc(svc.ClusterIPs, func(a netip.Addr) bool { return a.Unmap() == k.addr }) {
		return []setEntry{{set: familySet(setClusterIP, f), addr: k.addr, proto: k.proto, port: k.port}}
	}
	out := []setEntry{{set: familySet(setExternal, f), addr: k.addr, proto: k.proto, port: k.port}}
	if svc.ExternalLocal {
		out = append(out, setEntry{set: familySet(setExternalLocal, f), addr: k.addr, proto: k.proto, port: k.port})
	}
	return out
}
