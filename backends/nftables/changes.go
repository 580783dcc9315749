package nftables

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/sdk/plan"
)

// state is everything the backend has committed to the kernel.
type state struct {
	services   map[plan.Key]*serviceState
	picks      map[uint32]int     // services per total weight
	hairpin    map[netip.Addr]int // services per endpoint address
	nextTarget uint32
}

func newState() *state {
	return &state{services: map[plan.Key]*serviceState{}, picks: map[uint32]int{}, hairpin: map[netip.Addr]int{}, nextTarget: 1}
}

// changes is a pending update of state: it is merged only after the kernel
// accepted the transaction, so a failed commit leaves state matching the
// kernel's previous rules.
type changes struct {
	base     *state
	services map[plan.Key]*serviceState // nil value: deleted
	picks    map[uint32]int
	hairpin  map[netip.Addr]int
	next     uint32
	del, add map[string][]element
}

func newChanges(base *state) *changes {
	return &changes{
		base: base, services: map[plan.Key]*serviceState{}, picks: map[uint32]int{}, hairpin: map[netip.Addr]int{},
		next: base.nextTarget, del: map[string][]element{}, add: map[string][]element{},
	}
}

func (c *changes) pickCount(w uint32) int {
	if n, ok := c.picks[w]; ok {
		return n
	}
	return c.base.picks[w]
}

func (c *changes) hairpinCount(a netip.Addr) int {
	if n, ok := c.hairpin[a]; ok {
		return n
	}
	return c.base.hairpin[a]
}

// update records that key moves from old to the plan's service (nil: deleted).
func (c *changes) update(key plan.Key, svc *plan.Service) {
	old := c.base.services[key]
	var cur *serviceState
	if svc != nil {
		target := c.next
		if old != nil {
			target = old.internal.target
		}
		cur = newServiceState(svc, target)
		if cur != nil && old == nil {
			c.next += 2
		}
	}
	if old == nil && cur == nil {
		return
	}
	c.services[key] = cur
	c.entries(old, cur)
	c.buckets(old, cur)
	c.refcounts(old, cur)
}

func (c *changes) entries(old, cur *serviceState) {
	if sameEntries(old, cur) {
		return
	}
	if old != nil {
		old.entryElements(func(set string, e element) { c.del[set] = append(c.del[set], e) })
	}
	if cur != nil {
		cur.entryElements(func(set string, e element) { c.add[set] = append(c.add[set], e) })
	}
}

// buckets records the bucket elements that change, pool by pool: only the
// changed buckets when a pool keeps its target and weight, all of them
// otherwise.
func (c *changes) buckets(old, cur *serviceState) {
	oldPools, curPools := old.pools(), cur.pools()
	for _, o := range oldPools {
		if i := slices.IndexFunc(curPools, func(p pool) bool { return samePoolShape(o, p) }); i >= 0 {
			m := endpointsMap(o.weight())
			idx := changedBuckets(o, curPools[i])
			c.del[m] = append(c.del[m], o.bucketElements(idx)...)
			c.add[m] = append(c.add[m], curPools[i].bucketElements(idx)...)
		} else if o.weight() > 0 {
			m := endpointsMap(o.weight())
			c.del[m] = append(c.del[m], o.bucketElements(o.allBuckets())...)
		}
	}
	for _, p := range curPools {
		if !slices.ContainsFunc(oldPools, func(o pool) bool { return samePoolShape(o, p) }) && p.weight() > 0 {
			m := endpointsMap(p.weight())
			c.add[m] = append(c.add[m], p.bucketElements(p.allBuckets())...)
		}
	}
}

func samePoolShape(a, b pool) bool { return a.target == b.target && a.weight() == b.weight() }

func (c *changes) refcounts(old, cur *serviceState) {
	for _, p := range old.pools() {
		if p.weight() > 0 {
			c.picks[p.weight()] = c.pickCount(p.weight()) - 1
		}
	}
	for _, p := range cur.pools() {
		if p.weight() > 0 {
			c.picks[p.weight()] = c.pickCount(p.weight()) + 1
		}
	}
	for _, a := range old.hairpinAddrs() {
		c.hairpin[a] = c.hairpinCount(a) - 1
	}
	for _, a := range cur.hairpinAddrs() {
		c.hairpin[a] = c.hairpinCount(a) + 1
	}
}

// write appends the changes to t in an order the kernel accepts: new pick
// objects, element deletions, element additions, then pick objects no
// service uses any more.
func (c *changes) write(t *txn, l *layout) {
	weights := sortedKeys(c.picks)
	for _, w := range weights {
		if c.base.picks[w] == 0 && c.picks[w] > 0 {
			l.addPick(t, w)
		}
	}
	for _, a := range sortedAddrs(c.hairpin) {
		was, now := c.base.hairpin[a], c.hairpin[a]
		switch {
		case was == 0 && now > 0:
			c.add[setHairpin] = append(c.add[setHairpin], hairpinElement(a))
		case was > 0 && now == 0:
			c.del[setHairpin] = append(c.del[setHairpin], hairpinElement(a))
		}
	}
	for _, name := range sortedKeys(c.del) {
		t.delElems(l.setNamed(name), c.del[name]...)
	}
	for _, name := range sortedKeys(c.add) {
		t.addElems(l.setNamed(name), c.add[name]...)
	}
	for _, w := range weights {
		if c.base.picks[w] > 0 && c.picks[w] == 0 {
			l.delPick(t, w)
		}
	}
}

// commit merges the changes into their base state.
func (c *changes) commit() {
	s := c.base
	for k, v := range c.services {
		if v == nil {
			delete(s.services, k)
		} else {
			s.services[k] = v
		}
	}
	mergeCounts(s.picks, c.picks)
	mergeCounts(s.hairpin, c.hairpin)
	s.nextTarget = c.next
}

func mergeCounts[K comparable](dst, src map[K]int) {
	for k, n := range src {
		if n <= 0 {
			delete(dst, k)
		} else {
			dst[k] = n
		}
	}
}

func sortedKeys[K interface{ ~string | ~uint32 }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedAddrs(m map[netip.Addr]int) []netip.Addr {
	keys := make([]netip.Addr, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, netip.Addr.Compare)
	return keys
}

// setNamed returns a handle for one of the layout's sets or maps; element
// operations need only the name and table.
func (l *layout) setNamed(name string) *nftables.Set {
	return &nftables.Set{Table: l.table, Name: name}
}
