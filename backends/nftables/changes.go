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
	services  map[plan.Key]*serviceState
	maps      map[mapID]int      // entries drawing from each endpoints map
	chains    map[pickSpec]int   // elements sending packets to each pick chain
	hairpin   map[netip.Addr]int // services per endpoint address
	clusterIP map[netip.Addr]int // service ports per cluster IP
	podCIDRs  []netip.Prefix     // what the pod-cidrs set holds
	nodeAddrs []netip.Prefix     // what the nodeport-cidrs set holds with NodePortPrimary
	// serviceCIDRs is what the service-cidrs set holds.
	serviceCIDRs []netip.Prefix
}

func newState() *state {
	return &state{services: map[plan.Key]*serviceState{}, maps: map[mapID]int{}, chains: map[pickSpec]int{},
		hairpin: map[netip.Addr]int{}, clusterIP: map[netip.Addr]int{}}
}

// changes is a pending update of state: it is merged only after the kernel
// accepted the transaction, so a failed commit leaves state matching the
// kernel's previous rules.
type changes struct {
	fam       *family
	base      *state
	services  map[plan.Key]*serviceState // nil value: deleted
	maps      map[mapID]int
	chains    map[pickSpec]int
	hairpin   map[netip.Addr]int
	clusterIP map[netip.Addr]int
	// sticky holds the service ports whose sticky objects change.
	sticky       []stickyChange
	podCIDRs     []netip.Prefix
	nodeAddrs    []netip.Prefix
	serviceCIDRs []netip.Prefix
	del, add     map[string][]element
}

// stickyChange is a change of one service port's sticky objects.
type stickyChange struct{ old, cur *serviceState }

func newChanges(base *state, f *family) *changes {
	return &changes{fam: f,
		base: base, services: map[plan.Key]*serviceState{}, maps: map[mapID]int{}, chains: map[pickSpec]int{},
		hairpin: map[netip.Addr]int{}, clusterIP: map[netip.Addr]int{}, del: map[string][]element{}, add: map[string][]element{},
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
		cur = newServiceState(svc, c.fam)
	}
	if old == nil && cur == nil {
		return
	}
	c.services[key] = cur
	c.entries(old, cur)
	c.buckets(old, cur)
	c.refcounts(old, cur)
	if (old != nil && old.affinity > 0) || (cur != nil && cur.affinity > 0) {
		c.sticky = append(c.sticky, stickyChange{old: old, cur: cur})
	}
}

func (c *changes) entries(old, cur *serviceState) {
	if sameEntries(old, cur) {
		return
	}
	if old != nil {
		old.entryElements(func(set string, e element, d *draw) {
			c.del[set] = append(c.del[set], e)
			if spec, ok := old.pickSpec(d); ok {
				c.chains[spec] = count(c.chains, c.base.chains, spec) - 1
			}
		})
	}
	if cur != nil {
		cur.entryElements(func(set string, e element, d *draw) {
			c.add[set] = append(c.add[set], e)
			if spec, ok := cur.pickSpec(d); ok {
				c.chains[spec] = count(c.chains, c.base.chains, spec) + 1
			}
		})
	}
}

// buckets records the bucket elements that change, entry by entry: only
// the changed buckets when an entry keeps its weight, all of them
// otherwise. Sticky chains hold their endpoints in rules, not buckets.
func (c *changes) buckets(old, cur *serviceState) {
	was, now := old.bucketDraws(), cur.bucketDraws()
	find := func(ds []draw, d draw) int {
		return slices.IndexFunc(ds, func(o draw) bool { return o.mapID() == d.mapID() && string(o.key) == string(d.key) })
	}
	for _, o := range was {
		m := o.mapID().name()
		if i := find(now, o); i >= 0 {
			idx := changedBuckets(o.pool, now[i].pool)
			c.del[m] = append(c.del[m], o.bucketElements(idx)...)
			c.add[m] = append(c.add[m], now[i].bucketElements(idx)...)
		} else {
			c.del[m] = append(c.del[m], o.bucketElements(o.pool.allBuckets())...)
		}
	}
	for _, d := range now {
		if find(was, d) < 0 {
			m := d.mapID().name()
			c.add[m] = append(c.add[m], d.bucketElements(d.pool.allBuckets())...)
		}
	}
}

// mapID is the endpoints map a draw's buckets are in.
func (d draw) mapID() mapID { return mapID{lane: d.kind.lane(), weight: d.pool.weight()} }

// pickSpec returns the shared pick chain an entry's draw goes through;
// false for the other elements and for sticky chains.
func (s *serviceState) pickSpec(d *draw) (pickSpec, bool) {
	if d == nil || s.affinity > 0 {
		return pickSpec{}, false
	}
	return pickSpec{kind: d.kind, weight: d.pool.weight()}, true
}

// bucketDraws returns the draws whose buckets are in endpoints maps.
func (s *serviceState) bucketDraws() []draw {
	if s == nil || s.affinity > 0 {
		return nil
	}
	return s.draws()
}

func (c *changes) refcounts(old, cur *serviceState) {
	for _, d := range old.bucketDraws() {
		c.maps[d.mapID()] = count(c.maps, c.base.maps, d.mapID()) - 1
	}
	for _, d := range cur.bucketDraws() {
		c.maps[d.mapID()] = count(c.maps, c.base.maps, d.mapID()) + 1
	}
	recount(c.hairpin, c.base.hairpin, old.hairpinAddrs(), cur.hairpinAddrs())
	recount(c.clusterIP, c.base.clusterIP, old.clusterIPs(), cur.clusterIPs())
}

// recount moves one reference per address from those of old to those of
// cur, in the pending counts over base.
func recount(pending, base map[netip.Addr]int, old, cur []netip.Addr) {
	for _, a := range old {
		pending[a] = count(pending, base, a) - 1
	}
	for _, a := range cur {
		pending[a] = count(pending, base, a) + 1
	}
}

// write appends the changes to t in an order the kernel accepts: new maps
// and pick chains, element deletions, element additions, then the chains and
// maps nothing uses any more.
func (c *changes) write(t *txn, l *layout) {
	ids := sortedMaps(c.maps)
	specs := sortedSpecs(c.chains)
	for _, m := range ids {
		if c.base.maps[m] == 0 && c.maps[m] > 0 {
			l.addEndpointsMap(t, m)
		}
	}
	for _, spec := range specs {
		if c.base.chains[spec] == 0 && c.chains[spec] > 0 {
			l.addPickChain(t, spec)
		}
	}
	for _, sc := range c.sticky {
		l.addSticky(t, sc.old, sc.cur)
	}
	c.counted(setHairpin, c.hairpin, c.base.hairpin, hairpinElement)
	c.counted(setClusterIPs, c.clusterIP, c.base.clusterIP, addrElement)
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
	for _, sc := range c.sticky {
		l.delSticky(t, sc.old.sticky(), sc.cur.sticky())
	}
	for _, m := range ids {
		if c.base.maps[m] > 0 && c.maps[m] == 0 {
			l.delEndpointsMap(t, m)
		}
	}
}

func sortedMaps(m map[mapID]int) []mapID {
	ids := make([]mapID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b mapID) int { return cmp.Or(cmp.Compare(a.weight, b.weight), cmp.Compare(a.lane, b.lane)) })
	return ids
}

func sortedSpecs(m map[pickSpec]int) []pickSpec {
	specs := make([]pickSpec, 0, len(m))
	for s := range m {
		specs = append(specs, s)
	}
	slices.SortFunc(specs, func(a, b pickSpec) int {
		return cmp.Or(cmp.Compare(a.weight, b.weight), cmp.Compare(a.kind, b.kind))
	})
	return specs
}

// counted adds to set the element of each address whose count rises from
// zero, and deletes that of each whose count falls to zero.
func (c *changes) counted(set string, pending, base map[netip.Addr]int, elem func(netip.Addr) element) {
	for _, a := range sortedAddrs(pending) {
		was, now := base[a], pending[a]
		switch {
		case was == 0 && now > 0:
			c.add[set] = append(c.add[set], elem(a))
		case was > 0 && now == 0:
			c.del[set] = append(c.del[set], elem(a))
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
	mergeCounts(s.maps, c.maps)
	mergeCounts(s.chains, c.chains)
	mergeCounts(s.hairpin, c.hairpin)
	mergeCounts(s.clusterIP, c.clusterIP)
	s.podCIDRs = c.podCIDRs
	s.nodeAddrs = c.nodeAddrs
	s.serviceCIDRs = c.serviceCIDRs
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
