package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/moby/ipvs"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// IPVS service flags (include/uapi/linux/ip_vs.h).
const flagPersistent = 0x0001

// ipvsConn is the part of *ipvs.Handle the backend uses: one round trip
// per call, for the graceful-termination loop and tests (syncs use
// genlConn).
type ipvsConn interface {
	NewService(*ipvs.Service) error
	UpdateService(*ipvs.Service) error
	DelService(*ipvs.Service) error
	GetServices() ([]*ipvs.Service, error)
	NewDestination(*ipvs.Service, *ipvs.Destination) error
	UpdateDestination(*ipvs.Service, *ipvs.Destination) error
	DelDestination(*ipvs.Service, *ipvs.Destination) error
	GetDestinations(*ipvs.Service) ([]*ipvs.Destination, error)
	Close()
}

// protoNumber returns the IP protocol number of p, or 0 when IPVS cannot
// balance it.
func protoNumber(p plan.Protocol) uint16 {
	switch p {
	case plan.TCP:
		return unix.IPPROTO_TCP
	case plan.UDP:
		return unix.IPPROTO_UDP
	case plan.SCTP:
		return unix.IPPROTO_SCTP
	}
	return 0
}

func protoOf(n uint16) (plan.Protocol, bool) {
	for _, p := range []plan.Protocol{plan.TCP, plan.UDP, plan.SCTP} {
		if protoNumber(p) == n {
			return p, true
		}
	}
	return "", false
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// toService returns the netlink form of a virtual server; vs may be nil
// when only the key matters (deletes, dumps).
func toService(k vsKey, vs *virtualServer) *ipvs.Service {
	s := &ipvs.Service{Address: k.addr.AsSlice(), Protocol: protoNumber(k.proto), Port: k.port,
		AddressFamily: family(k.addr), Netmask: 0xffffffff, FWMark: k.mark}
	if k.addr.Is6() {
		s.Netmask = 128 // a prefix length for IPv6
	}
	if vs != nil {
		s.SchedName = vs.scheduler
		if vs.persistence > 0 {
			s.Flags, s.Timeout = flagPersistent, vs.persistence
		}
	}
	return s
}

// fromService returns the key and settings of a kernel virtual server;
// false for ones Weir never makes (marks outside its range, other
// protocols).
func fromService(s *ipvs.Service) (vsKey, *virtualServer, bool) {
	var persistence uint32
	if s.Flags&flagPersistent != 0 {
		persistence = s.Timeout
	}
	vs := newVirtualServer(s.SchedName, persistence)
	if s.FWMark != 0 {
		f := 4
		if s.AddressFamily == unix.AF_INET6 {
			f = 6
		}
		return markKey(s.FWMark, f), vs, inMarkRange(s.FWMark)
	}
	a, ok := netip.AddrFromSlice(s.Address)
	proto, known := protoOf(s.Protocol)
	if !ok || !known {
		return vsKey{}, nil, false
	}
	a = a.Unmap()
	if s.AddressFamily == unix.AF_INET6 {
		a = netip.AddrFrom16(a.As16())
	}
	return vsKey{addr: a, proto: proto, port: s.Port}, vs, true
}

func fromDestination(d *ipvs.Destination) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(d.Address)
	if !ok {
		return netip.AddrPort{}, false
	}
	if d.AddressFamily == unix.AF_INET {
		a = a.Unmap()
	} else {
		a = netip.AddrFrom16(a.As16())
	}
	return netip.AddrPortFrom(a, d.Port), true
}

// readKernel dumps the kernel's virtual servers for which ours is true,
// with their real servers (see addReals).
func readKernel(c *genlConn, ours func(vsKey) bool) (map[vsKey]*virtualServer, error) {
	svcs, err := c.services()
	if err != nil {
		return nil, fmt.Errorf("ipvs: list virtual servers: %w", err)
	}
	out := map[vsKey]*virtualServer{}
	for _, s := range svcs {
		k, vs, ok := fromService(s)
		if !ok || !ours(k) {
			continue
		}
		dests, err := c.dests(k)
		if err != nil {
			return nil, fmt.Errorf("ipvs: list real servers of virtual server %s: %w", k, err)
		}
		addReals(vs, dests)
		out[k] = vs
	}
	return out, nil
}

// notNAT is the weight the read-back gives a real server that does not
// forward by NAT (masquerading): changed behind Weir's back, it reaches
// no endpoint, and as no wanted weight is negative a sync updates it.
const notNAT = -1

// addReals adds the kernel's real servers dests to vs.
func addReals(vs *virtualServer, dests []*ipvs.Destination) {
	for _, d := range dests {
		a, ok := fromDestination(d)
		switch {
		case !ok:
		case d.ConnectionFlags&ipvs.ConnectionFlagFwdMask != ipvs.ConnectionFlagMasq:
			vs.reals[a] = notNAT
		default:
			vs.reals[a] = int32(d.Weight)
		}
	}
}

// record notes in programmed that the kernel took o. A change to a real
// server of a virtual server that was never recorded is not noted (the
// kernel cannot have taken it).
func record(programmed map[vsKey]*virtualServer, o op, now time.Time) {
	vs := programmed[o.key]
	if vs == nil && o.kind != opAddVS {
		return
	}
	switch o.kind {
	case opAddVS:
		programmed[o.key] = newVirtualServer(o.vs.scheduler, o.vs.persistence)
	case opUpdateVS:
		vs.scheduler, vs.persistence = o.vs.scheduler, o.vs.persistence
	case opDelVS:
		delete(programmed, o.key)
	case opAddRS, opUpdateRS:
		vs.reals[o.real] = o.weight
		delete(vs.draining, o.real)
	case opDrainRS:
		vs.reals[o.real] = 0
		vs.draining[o.real] = now
	case opDelRS:
		delete(vs.reals, o.real)
		delete(vs.draining, o.real)
	}
}

// ignoreGone treats "no such virtual or real server" as success.
func ignoreGone(err error) error {
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
