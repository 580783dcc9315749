package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// The ipsets of the masquerade layer. Hash sets hold one address family
// each: the IPv6 set's name adds setSuffix6. The node-port bitmaps hold
// ports only and serve both families.
const (
	// setClusterIP holds cluster IP, protocol and port of every service.
	setClusterIP = "WEIR-IPVS-CLUSTER-IP"
	// setExternal holds the external and load-balancer IPs with protocol
	// and port, and the node-port addresses of SCTP node ports (bitmap:port
	// sets match only TCP and UDP).
	setExternal = "WEIR-IPVS-EXTERNAL"
	// setExternalLocal holds the entries of setExternal whose service has
	// externalTrafficPolicy Local: they keep the client's address.
	setExternalLocal = "WEIR-IPVS-EXTERNAL-LOCAL"
	// setHairpin holds endpoint, protocol and port, endpoint: an endpoint
	// reaching itself through a service.
	setHairpin = "WEIR-IPVS-HAIRPIN"
	// setSuffix6 ends the names of the IPv6 hash sets.
	setSuffix6 = "-6"
	// setNodePort and setNodePortLocal prefix the node-port bitmaps of
	// each protocol ("WEIR-IPVS-NODE-PORT-TCP"); the Local ones hold the
	// node ports of services with externalTrafficPolicy Local.
	setNodePort      = "WEIR-IPVS-NODE-PORT-"
	setNodePortLocal = "WEIR-IPVS-NODE-PORT-LOCAL-"
)

// setSpec describes one ipset: its name, type and family (4 or 6; 0 for
// the port bitmaps).
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
	for _, p := range bitmapProtocols {
		out = append(out, setSpec{setNodePort + string(p), "bitmap:port", 0},
			setSpec{setNodePortLocal + string(p), "bitmap:port", 0})
	}
	return out
}

// bitmapProtocols are the protocols whose node ports go into port bitmaps.
var bitmapProtocols = []plan.Protocol{plan.TCP, plan.UDP}

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

// setEntry is one member of one set. addr is zero in the port bitmaps;
// addr2 is set only in the hairpin sets.
type setEntry struct {
	set   string
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
	addr2 netip.Addr
}

// String formats the entry as the ipset tool lists it, after the set name.
func (e setEntry) String() string {
	s := e.set + " "
	if e.addr.IsValid() {
		s += e.addr.String() + ","
	}
	s += fmt.Sprintf("%s:%d", e.proto, e.port)
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
func masqEntries(svc *plan.Service, st *serviceState, nodePorts []netip.Addr) []setEntry {
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
		for _, e := range destEntries(svc, k, nodePorts) {
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
// virtual server k of svc is.
func destEntries(svc *plan.Service, k vsKey, nodePorts []netip.Addr) []setEntry {
	f := familyOf(k.addr)
	isCluster := k.port == svc.Port && slices.ContainsFunc(svc.ClusterIPs, func(a netip.Addr) bool { return a.Unmap() == k.addr })
	isNodePort := !isCluster && svc.NodePort != 0 && k.port == svc.NodePort && slices.Contains(nodePorts, k.addr)
	switch {
	case isCluster:
		return []setEntry{{set: familySet(setClusterIP, f), addr: k.addr, proto: k.proto, port: k.port}}
	case isNodePort && slices.Contains(bitmapProtocols, k.proto):
		out := []setEntry{{set: setNodePort + string(k.proto), proto: k.proto, port: k.port}}
		if svc.ExternalLocal {
			out = append(out, setEntry{set: setNodePortLocal + string(k.proto), proto: k.proto, port: k.port})
		}
		return out
	}
	out := []setEntry{{set: familySet(setExternal, f), addr: k.addr, proto: k.proto, port: k.port}}
	if svc.ExternalLocal {
		out = append(out, setEntry{set: familySet(setExternalLocal, f), addr: k.addr, proto: k.proto, port: k.port})
	}
	return out
}
