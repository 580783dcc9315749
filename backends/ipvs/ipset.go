package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ipsetConn is the part of *netlink.Handle the set layer uses.
type ipsetConn interface {
	IpsetCreate(name, kind string, o netlink.IpsetCreateOptions) error
	IpsetDestroy(name string) error
	IpsetList(name string) (*netlink.IPSetResult, error)
	IpsetAdd(name string, e *netlink.IPSetEntry) error
	IpsetDel(name string, e *netlink.IPSetEntry) error
}

// setCapacity is the most entries a set holds (the kernel's default is
// 65536; the hairpin set needs one per endpoint: 100k at 10k services ×
// 10 endpoints). Hash sets grow as needed up to it.
const setCapacity = 1 << 20

// ensureSets creates the sets that are missing. A set that exists keeps
// the capacity it was created with.
func ensureSets(c ipsetConn) error {
	for _, s := range allSets() {
		o := netlink.IpsetCreateOptions{Family: unix.AF_INET, MaxElements: setCapacity}
		if s.family == 6 {
			o.Family = unix.AF_INET6
		}
		err := c.IpsetCreate(s.name, s.kind, o)
		if err != nil && !errors.Is(err, unix.EEXIST) && !isIpsetErr(err, nl.IPSET_ERR_EXIST_SETNAME2) {
			return fmt.Errorf("ipvs: create ipset %s (%s): %w", s.name, s.kind, err)
		}
	}
	return nil
}

func isIpsetErr(err error, code int) bool {
	var e nl.IPSetError
	return errors.As(err, &e) && int(e) == code
}

// reconcileSets makes every set hold exactly the entries of want, reading
// each set back.
func reconcileSets(c ipsetConn, want map[setEntry]int) error {
	var errs []error
	for _, s := range allSets() {
		res, err := c.IpsetList(s.name)
		if err != nil {
			errs = append(errs, fmt.Errorf("ipvs: list ipset %s: %w", s.name, err))
			continue
		}
		have := map[setEntry]bool{}
		for i := range res.Entries {
			if e, ok := fromIpsetEntry(s, &res.Entries[i]); ok {
				have[e] = true
			} else {
				errs = append(errs, delEntryRaw(c, s.name, &res.Entries[i]))
			}
		}
		for e := range have {
			if want[e] == 0 {
				errs = append(errs, delEntry(c, e))
			}
		}
		for _, e := range slices.SortedFunc(maps.Keys(want), setEntry.compare) {
			if e.set == s.name && !have[e] {
				errs = append(errs, addEntry(c, e))
			}
		}
	}
	return firstOf(errs)
}

// updateSets moves the reference counts from old entries to new ones,
// adding entries that gain their first reference and deleting those
// that lose their last.
func updateSets(c ipsetConn, refs map[setEntry]int, old, new []setEntry) error {
	var errs []error
	for _, e := range new {
		if refs[e]++; refs[e] == 1 {
			errs = append(errs, addEntry(c, e))
		}
	}
	for _, e := range old {
		if refs[e]--; refs[e] <= 0 {
			delete(refs, e)
			errs = append(errs, delEntry(c, e))
		}
	}
	return firstOf(errs)
}

// destroySets removes every set of the layer; missing ones are fine.
func destroySets(c ipsetConn) error {
	var errs []error
	for _, s := range allSets() {
		if err := c.IpsetDestroy(s.name); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("ipvs: destroy ipset %s: %w", s.name, err))
		}
	}
	return firstOf(errs)
}

func addEntry(c ipsetConn, e setEntry) error {
	if err := c.IpsetAdd(e.set, toIpsetEntry(e)); err != nil {
		return fmt.Errorf("ipvs: add %s to ipset %s: %w", e.member(), e.set, err)
	}
	return nil
}

func delEntry(c ipsetConn, e setEntry) error {
	if err := c.IpsetDel(e.set, toIpsetEntry(e)); err != nil {
		return fmt.Errorf("ipvs: delete %s from ipset %s: %w", e.member(), e.set, err)
	}
	return nil
}

func delEntryRaw(c ipsetConn, set string, e *netlink.IPSetEntry) error {
	e.Replace = true
	if err := c.IpsetDel(set, e); err != nil {
		return fmt.Errorf("ipvs: delete an unreadable entry from ipset %s: %w", set, err)
	}
	return nil
}

// toIpsetEntry returns the netlink form of e. Replace makes adding a
// present entry and deleting a missing one succeed.
func toIpsetEntry(e setEntry) *netlink.IPSetEntry {
	proto := uint8(protoNumber(e.proto))
	port := e.port
	out := &netlink.IPSetEntry{IP: e.addr.AsSlice(), Protocol: &proto, Port: &port, Replace: true}
	if e.addr2.IsValid() {
		out.IP2 = e.addr2.AsSlice()
	}
	if e.bits2 > 0 {
		out.CIDR2 = e.bits2
	}
	return out
}

// fromIpsetEntry returns the entry of set s that the kernel listed;
// false when it is not one Weir could have added.
func fromIpsetEntry(s setSpec, n *netlink.IPSetEntry) (setEntry, bool) {
	if n.Port == nil || n.Protocol == nil || n.IP == nil {
		return setEntry{}, false
	}
	p, ok := protoOf(uint16(*n.Protocol))
	if !ok {
		return setEntry{}, false
	}
	e := setEntry{set: s.name, proto: p, port: *n.Port}
	e.addr, ok = netip.AddrFromSlice(n.IP)
	e.addr = e.addr.Unmap()
	if ok && n.IP2 != nil {
		e.addr2, ok = netip.AddrFromSlice(n.IP2)
		e.addr2 = e.addr2.Unmap()
	}
	if s.kind == kindIPPortNet {
		e.bits2 = n.CIDR2
		ok = ok && e.addr2.IsValid() && n.CIDR2 > 0
	}
	return e, ok
}

// member formats the entry without its set name.
func (e setEntry) member() string {
	s := e.String()
	return s[len(e.set)+1:]
}
