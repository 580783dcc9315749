package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"golang.org/x/sys/unix"
)

// readSets lists every set of the layer, noting missing sets, sets of the
// wrong kind and entries Weir could not have written.
func readSets(c ipsetConn, bad *anomalies) (map[string]map[setEntry]bool, error) {
	out := map[string]map[setEntry]bool{}
	for _, s := range allSets() {
		res, err := c.IpsetList(s.name)
		switch {
		case errors.Is(err, unix.ENOENT):
			bad.add("ipsets missing", s.name)
			continue
		case err != nil:
			return nil, fmt.Errorf("ipvs: list ipset %s: %w", s.name, err)
		}
		if m := s.mismatch(res); m != "" {
			bad.add("ipsets that are not what Weir creates", s.name+": "+m)
		}
		entries := map[setEntry]bool{}
		for i := range res.Entries {
			e, ok := fromIpsetEntry(s, &res.Entries[i])
			if !ok {
				bad.add("ipsets holding entries Weir does not write", s.name)
				continue
			}
			entries[e] = true
		}
		out[s.name] = entries
	}
	return out, nil
}

// destinationSets are the sets whose entries name a destination (a
// virtual server's address, protocol and port).
var destinationSets = []string{setClusterIP, setExternal, setExternalLocal, setDrop, setFirewall}

// checkSets notes entries that name no destination of Weir's (ours, the
// virtual servers read as such), external Local destinations missing
// from WEIR-IPVS-EXTERNAL, source ranges of destinations without a
// firewall entry, and real servers taking connections without their
// hairpin entry. (Hairpin entries no real server needs are harmless and
// not reported: a real server drained away keeps its entry until the
// next full sync.)
func (s *snapshot) checkSets(ours map[vsKey]bool) {
	for _, name := range destinationSets {
		for _, f := range []int{4, 6} {
			set := familySet(name, f)
			for _, e := range sortedEntries(s.sets[set]) {
				k := vsKey{addr: e.addr, proto: e.proto, port: e.port}
				switch {
				case !ours[k]:
					s.bad.add("ipset entries naming no virtual server of Weir's", e.String())
				case name == setExternalLocal && !s.has(destOf(setExternal, k)):
					s.bad.add("destinations in WEIR-IPVS-EXTERNAL-LOCAL but not in WEIR-IPVS-EXTERNAL", e.String())
				}
			}
		}
	}
	for _, f := range []int{4, 6} {
		for _, e := range sortedEntries(s.sets[familySet(setSourceRanges, f)]) {
			if !s.has(destOf(setFirewall, vsKey{addr: e.addr, proto: e.proto, port: e.port})) {
				s.bad.add("source ranges of destinations not in WEIR-IPVS-FIREWALL", e.String())
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(ours), vsKey.compare) {
		for a, w := range s.servers[k].reals {
			f := familyOf(a.Addr())
			e := setEntry{set: familySet(setHairpin, f), addr: a.Addr(), proto: k.proto, port: a.Port(), addr2: a.Addr()}
			if w > 0 && s.sets[e.set] != nil && !s.has(e) {
				s.bad.add("real servers missing from WEIR-IPVS-HAIRPIN (an endpoint reaching itself through the service is not masqueraded)", e.String())
			}
		}
	}
}

func sortedEntries(m map[setEntry]bool) []setEntry {
	return slices.SortedFunc(maps.Keys(m), setEntry.compare)
}
