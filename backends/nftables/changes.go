package nftables

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/sdk/plan"
)

// state is everything the backend has committed to the kernel.
type state struct {
	services   map[plan.Key]*serviceState
	maps       map[uint32]int     // pools per total weight: endpoints-W users
	chains     map[pickSpec]int   // elements sending packets to each pick chain
	hairpin    map[netip.Addr]int // services per endpoint address
	nextTarget uint32
	podCIDRs   []netip.Prefix // what the pod-cidrs set holds
	nodeAddrs  []netip.Prefix // what the nodeport-cidrs set holds with NodePortPrimary
}

func newState() *state {
	return &state{services: map[plan.Key]*serviceState{}, maps: map[uint32]int{}, chains: map[pickSpec]int{},
		hairpin: map[netip.Addr]int{}, nextTarget: 1}
}

// changes is a pending update of state: it is merged only after the kernel
// accepted the transaction, so a failed commit leaves state matching the
// kernel's previous rules.
type changes struct {
	fam      *family
	base     *state
	services map[plan.Key]*serviceState // nil value: deleted
	maps     map[uint32]int
	chains   map[pickSpec]int
	hairpin  map[netip.Addr]int
	next     uint32
	// prior, in a full sync, is the state being replaced: services keep
	// their target ids, so affinity entries stay valid.
	prior     *state
	podCIDRs  []netip.Prefix
	nodeAddrs []netip.Prefix
	del, add  map[string][]element
}

func newChanges(base *state, f *family) *changes {
	return &changes{fam: f,
		base: base, services: map[plan.Key]*serviceState{}, maps: map[uint32]int{}, chains: map[pickSpec]int{},
		hairpin: map[netip.Addr]int{},
		next:    base.nextTarget, del: map[string][]element{}, add: map[string][]element{},
	}
}

// count returns a pending count, or the committed one when unchanged.
func count[K comparable](pending, base map[K]int, k K) int {
	if n, ok := pending[k]; ok {
		return n
	}
	return base[k]
}

// update records that key moves from old to the plan's service (nil: deleted).
func (c *changes) update(key plan.Key, svc *plan.Service) {
	old := c.base.services[key]
	var cur *serviceState
	if svc != nil {
		target, fresh := c.targetFor(key, old)
		cur = newServiceState(svc, target, c.fam)
		if cur != nil && fresh {
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

// targetFor returns the key's target id: its current one, its one before a
// full sync, or a fresh one (fresh is then true).
func (c *changes) targetFor(key plan.Key, old *serviceState) (target uint32, fresh bool) {
	if old != nil {
		return old.internal.target, false
	}
	if c.prior != nil {
		c.next = max(c.next, c.prior.nextTarget)
		if p := c.prior.services[key]; p != nil {
			return p.internal.target, false
		}
	}
	return c.next, true
}

func (c *changes) entries(old, cur *serviceState) {
	if sameEntries(old, cur) {
		return
	}
	if old != nil {
		old.entryElements(func(set string, e element, spec *pickSpec) {
			c.del[set] = append(c.del[set], e)
			if spec != nil {
				c.chains[*spec] = count(c.chains, c.base.chains, *spec) - 1
			}
		})
	}
	if cur != nil {
		cur.entryElements(func(set string, e element, spec *pickSpec) {
			c.add[set] = append(c.add[set], e)
			if spec != nil {
				c.chains[*spec] = count(c.chains, c.base.chains, *spec) + 1
			}
		})
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
			c.maps[p.weight()] = count(c.maps, c.base.maps, p.weight()) - 1
		}
	}
	for _, p := range cur.pools() {
		if p.weight() > 0 {
			c.maps[p.weight()] = count(c.maps, c.base.maps, p.weight()) + 1
		}
	}
	for _, a := range old.hairpinAddrs() {
		c.hairpin[a] = count(c.hairpin, c.base.hairpin, a) - 1
	}
	for _, a := range cur.hairpinAddrs() {
		c.hairpin[a] = count(c.hairpin, c.base.hairpin, a) + 1
	}
}

// write appends the changes to t in an order the kernel accepts: new maps
// and pick chains, element deletions, element additions, then the chains and
// maps nothing uses any more.
func (c *changes) write(t *txn, l *layout) {
	weights := sortedKeys(c.maps)
	specs := sortedSpecs(c.chains)
	for _, w := range weights {
		if c.base.maps[w] == 0 && c.maps[w] > 0 {
			l.addEndpointsMap(t, w)
		}
	}
	for _, spec := range specs {
		if c.base.chains[spec] == 0 && c.chains[spec] > 0 {
			l.addPickChain(t, spec)
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
	for _, spec := range specs {
		if c.base.chains[spec] > 0 && c.chains[spec] == 0 {
			l.delPickChain(t, spec)
		}
	}
	for _, w := range weights {
		if c.base.maps[w] > 0 && c.maps[w] == 0 {
			l.delEndpointsMap(t, w)
		}
	}
}

func sortedSpecs(m map[pickSpec]int) []pickSpec {
	specs := make([]pickSpec, 0, len(m))
	for s := range m {
		specs = append(specs, s)
	}
	slices.SortFunc(specs, func(a, b pickSpec) int {
		return cmp.Or(cmp.Compare(a.weight, b.weight), cmp.Compare(a.kind, b.kind), cmp.Compare(a.affinity, b.affinity))
	})
	return specs
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
	mergeCounts(s.maps, c.maps)
	mergeCounts(s.chains, c.chains)
	mergeCounts(s.hairpin, c.hairpin)
	s.nextTarget = c.next
	s.podCIDRs = c.podCIDRs
	s.nodeAddrs = c.nodeAddrs
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
