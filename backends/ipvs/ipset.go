package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ipsetConn is the kernel interface the set layer uses: *setConn.
type ipsetConn interface {
	IpsetCreate(name, kind string, o netlink.IpsetCreateOptions) error
	IpsetDestroy(name string) error
	IpsetList(name string) (*netlink.IPSetResult, error)
	IpsetDel(name string, e *netlink.IPSetEntry) error
	// apply adds (or with del, deletes) entries of one set; adding a
	// present entry and deleting a missing one succeed.
	apply(set string, del bool, es []setEntry) error
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

// listSets lists every set of the layer with its entries. wrong are the
// sets the kernel holds with another type or family than Weir creates,
// or with a smaller capacity: made by hand or by another program under
// Weir's name. A set that cannot be listed is left out, with an error.
func listSets(c ipsetConn) (lists map[string]*netlink.IPSetResult, wrong []setSpec, err error) {
	lists = map[string]*netlink.IPSetResult{}
	var errs []error
	for _, s := range allSets() {
		res, err := c.IpsetList(s.name)
		if err != nil {
			errs = append(errs, fmt.Errorf("ipvs: list ipset %s: %w", s.name, err))
			continue
		}
		lists[s.name] = res
		if s.mismatch(res) != "" {
			wrong = append(wrong, s)
		}
	}
	return lists, wrong, firstOf(errs)
}

// mismatch says how the listed set res differs from s in type, family or
// capacity; "" when it does not.
func (s setSpec) mismatch(res *netlink.IPSetResult) string {
	fam := uint8(unix.AF_INET)
	if s.family == 6 {
		fam = unix.AF_INET6
	}
	switch {
	case res.TypeName != s.kind:
		return fmt.Sprintf("type %s, want %s", res.TypeName, s.kind)
	case res.Family != fam:
		return fmt.Sprintf("family %d, want %d (IPv%d)", res.Family, fam, s.family)
	case res.MaxElements < setCapacity:
		return fmt.Sprintf("capacity %d, want %d", res.MaxElements, setCapacity)
	}
	return ""
}

// replaceSets destroys the sets wrong and creates them anew, empty. No
// rule may use them: the caller has flushed the layer's chains.
func replaceSets(c ipsetConn, wrong []setSpec) error {
	for _, s := range wrong {
		if err := c.IpsetDestroy(s.name); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("ipvs: destroy ipset %s to create it anew: %w", s.name, err)
		}
	}
	return ensureSets(c)
}

// reconcileSets makes every listed set hold exactly the entries of want.
func reconcileSets(c ipsetConn, lists map[string]*netlink.IPSetResult, want map[setEntry]int) error {
	bySet := map[string][]setEntry{}
	for e := range want {
		bySet[e.set] = append(bySet[e.set], e)
	}
	var errs []error
	for _, s := range allSets() {
		res := lists[s.name]
		if res == nil {
			continue
		}
		have := map[setEntry]bool{}
		var stale []setEntry
		for i := range res.Entries {
			e, ok := fromIpsetEntry(s, &res.Entries[i])
			switch {
			case !ok:
				errs = append(errs, delEntryRaw(c, s.name, &res.Entries[i]))
			case want[e] == 0:
				stale = append(stale, e)
			default:
				have[e] = true
			}
		}
		var missing []setEntry
		for _, e := range bySet[s.name] {
			if !have[e] {
				missing = append(missing, e)
			}
		}
		slices.SortFunc(missing, setEntry.compare)
		errs = append(errs, c.apply(s.name, true, stale), c.apply(s.name, false, missing))
	}
	return firstOf(errs)
}

// updateSets moves the reference counts from old entries to new ones,
// adding entries that gain their first reference and deleting those
// that lose their last. (Adding every new entry would also put back one
// removed by hand, but made a one-endpoint change of BenchmarkSync10k
// about 1-3 ms slower in the VM, with twice the allocations; the next
// full sync repairs the sets.)
func updateSets(c ipsetConn, refs map[setEntry]int, old, new []setEntry) error {
	adds, dels := map[string][]setEntry{}, map[string][]setEntry{}
	for _, e := range new {
		if refs[e]++; refs[e] == 1 {
			adds[e.set] = append(adds[e.set], e)
		}
	}
	for _, e := range old {
		if refs[e]--; refs[e] <= 0 {
			delete(refs, e)
			dels[e.set] = append(dels[e.set], e)
		}
	}
	var errs []error
	for _, s := range allSets() {
		errs = append(errs, c.apply(s.name, false, adds[s.name]), c.apply(s.name, true, dels[s.name]))
	}
	return firstOf(errs)
}

// destroySets removes every set of the layer and returns the names of
// those it destroyed; missing ones are fine.
func destroySets(c ipsetConn) ([]string, error) {
	var destroyed []string
	var errs []error
	for _, s := range allSets() {
		err := c.IpsetDestroy(s.name)
		switch {
		case err == nil:
			destroyed = append(destroyed, s.name)
		case !errors.Is(err, unix.ENOENT):
			errs = append(errs, fmt.Errorf("ipvs: destroy ipset %s: %w", s.name, err))
		}
	}
	return destroyed, firstOf(errs)
}

func delEntryRaw(c ipsetConn, set string, e *netlink.IPSetEntry) error {
	e.Replace = true
	if err := c.IpsetDel(set, e); err != nil {
		return fmt.Errorf("ipvs: delete an unreadable entry from ipset %s: %w", set, err)
	}
	return nil
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
