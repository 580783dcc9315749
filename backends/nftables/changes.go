package nftables

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/sdk/plan"
)

// addrKey is an address as a map key without a pointer (a netip.Addr has
// one), so the garbage collector does not scan the maps keyed by it.
type addrKey [16]byte

func addrKeyOf(a netip.Addr) addrKey { return a.As16() }

// bytes returns the address as the family's element bytes.
func (k *addrKey) bytes(f *family) []byte { return k[16-f.addrLen:] }

// state is everything the backend has committed to the kernel.
type state struct {
	services  map[plan.Key]*serviceState
	maps      map[mapID]int        // entries drawing from each endpoints map
	chains    map[pickSpec]int     // elements sending packets to each pick chain
	hairpin   map[hairpinKey]int32 // references per local endpoint (eachHairpin)
	clusterIP map[addrKey]int32    // service ports per cluster IP
	podCIDRs  []netip.Prefix       // what the pod-cidrs set holds
	nodeAddrs []netip.Prefix       // what the nodeport-cidrs set holds with NodePortPrimary
	// serviceCIDRs is what the service-cidrs set holds.
	serviceCIDRs []netip.Prefix
	// nodeIP is the node's IP the services' source ranges were written
	// with, and ranged the services whose elements depend on it (see
	// serviceState.ranged): a new node IP rewrites only those.
	nodeIP netip.Addr
	ranged map[plan.Key]struct{}
}

func newState() *state {
	return &state{services: map[plan.Key]*serviceState{}, maps: map[mapID]int{}, chains: map[pickSpec]int{},
		hairpin: map[hairpinKey]int32{}, clusterIP: map[addrKey]int32{}, ranged: map[plan.Key]struct{}{}}
}

// changes is a pending update of state: it is merged only after the kernel
// accepted the transaction, so a failed commit leaves state matching the
// kernel's previous rules. The elements the update adds and deletes are
// encoded as they are found, into a list per set.
type changes struct {
	fam   *family
	table *nftables.Table
	// plainBuckets is the layout's Options.PlainBuckets.
	plainBuckets bool
	base         *state
	services     map[plan.Key]*serviceState // nil value: deleted
	maps         map[mapID]int
	chains       map[pickSpec]int
	hairpin      counts[hairpinKey]
	clusterIP    counts[addrKey]
	// sticky holds the service ports whose sticky objects change.
	sticky       []stickyChange
	podCIDRs     []netip.Prefix
	nodeAddrs    []netip.Prefix
	serviceCIDRs []netip.Prefix
	// nodeIP is the node's IP of the family the services are computed
	// with (backends.NodeIP).
	nodeIP   netip.Addr
	del, add map[string]*elemList
	// mapLists and pickChains save formatting names per element.
	mapLists   map[mapList]*elemList
	pickChains map[pickSpec]string
}

// mapList is the list of an endpoints map's additions or deletions.
type mapList struct {
	id  mapID
	del bool
}

// stickyChange is a change of one service port's sticky objects.
type stickyChange struct{ old, cur *serviceState }

func newChanges(base *state, l *layout) *changes {
	return &changes{fam: l.fam, table: l.table, plainBuckets: l.opts.PlainBuckets, base: base, services: map[plan.Key]*serviceState{},
		maps: map[mapID]int{}, chains: map[pickSpec]int{}, hairpin: newCounts[hairpinKey](), clusterIP: newCounts[addrKey](),
		del: map[string]*elemList{}, add: map[string]*elemList{}, mapLists: map[mapList]*elemList{},
		pickChains: map[pickSpec]string{}}
}

// presize sizes the pending maps of a full sync of p, whose base is
// empty and which the state keeps: a service per key, at most an address
// per endpoint of the family, a cluster IP per service.
func (c *changes) presize(p *plan.Plan) {
	eps := 0
	for _, s := range p.Services {
		for i := range s.Endpoints {
			if c.fam.is(s.Endpoints[i].Address) {
				eps++
			}
		}
	}
	c.services = make(map[plan.Key]*serviceState, len(p.Services))
	c.hairpin = counts[hairpinKey]{m: make(map[hairpinKey]int32, eps), order: make([]hairpinKey, 0, eps)}
	c.clusterIP = counts[addrKey]{m: make(map[addrKey]int32, len(p.Services)), order: make([]addrKey, 0, len(p.Services))}
}

// list returns the list of elements to add to set, or with del set to
// delete from it.
func (c *changes) list(set string, del bool) *elemList {
	lists := c.add
	if del {
		lists = c.del
	}
	l := lists[set]
	if l == nil {
		l = newElemList(c.table, set, del)
		lists[set] = l
	}
	return l
}

// mapList returns the list of an endpoints map.
func (c *changes) mapList(m mapID, del bool) *elemList {
	k := mapList{id: m, del: del}
	l := c.mapLists[k]
	if l == nil {
		l = c.list(m.name(), del)
		c.mapLists[k] = l
	}
	return l
}

// chainFor returns the chain a draw's goto element names: the service's
// own sticky chain with ClientIP affinity, the shared pick chain otherwise.
func (c *changes) chainFor(s *serviceState, d *draw) string {
	spec, ok := s.pickSpec(d)
	if !ok {
		return stickyChain(d.kind, s.key)
	}
	name, ok := c.pickChains[spec]
	if !ok {
		name = spec.chain()
		c.pickChains[spec] = name
	}
	return name
}

// count returns a pending count, or the committed one when unchanged.
func count[K comparable](pending, base map[K]int, k K) int {
	if n, ok := pending[k]; ok {
		return n
	}
	return base[k]
}

// update records that key moves from old to the plan's service (nil:
// deleted); nothing when the service needs what was committed.
func (c *changes) update(key plan.Key, svc *plan.Service) {
	old := c.base.services[key]
	var cur *serviceState
	if svc != nil {
		cur = newServiceState(svc, c.fam, c.nodeIP)
	}
	if same(old, cur) {
		return
	}
	cur.nameComment(old)
	c.services[key] = cur
	was, now := old.draws(), cur.draws()
	c.entries(old, cur, was, now)
	c.buckets(cur, old.bucketDraws(was), cur.bucketDraws(now))
	c.refcounts(old, cur, was, now)
	if (old != nil && old.affinity > 0) || (cur != nil && cur.affinity > 0) {
		c.sticky = append(c.sticky, stickyChange{old: old, cur: cur})
	}
}

// entries records the entry elements when they change, and the elements
// each pick chain gains or loses.
func (c *changes) entries(old, cur *serviceState, was, now []draw) {
	if sameEntries(old, cur) {
		return
	}
	if old != nil {
		old.writeEntries(c, was, true)
		for i := range was {
			if spec, ok := old.pickSpec(&was[i]); ok {
				c.chains[spec] = count(c.chains, c.base.chains, spec) - 1
			}
		}
	}
	if cur != nil {
		cur.writeEntries(c, now, false)
		for i := range now {
			if spec, ok := cur.pickSpec(&now[i]); ok {
				c.chains[spec] = count(c.chains, c.base.chains, spec) + 1
			}
		}
	}
}

// buckets records the bucket elements that change, entry by entry: only
// the changed buckets when an entry keeps its weight, all of them
// otherwise. The added ones carry cur's comment unless buckets are plain.
func (c *changes) buckets(cur *serviceState, was, now []draw) {
	comment := ""
	if cur != nil && !c.plainBuckets {
		comment = cur.comment
	}
	find := func(ds []draw, d *draw) int {
		return slices.IndexFunc(ds, func(o draw) bool { return o.mapID() == d.mapID() && o.key == d.key })
	}
	for i := range was {
		o := &was[i]
		j := find(now, o)
		if j < 0 {
			c.writeBuckets(o, true, "", everyBucket)
			continue
		}
		n := &now[j]
		differs := func(b int) bool { return changed(o.pool, n.pool, b) }
		c.writeBuckets(o, true, "", differs)
		c.writeBuckets(n, false, comment, differs)
	}
	for i := range now {
		if find(was, &now[i]) < 0 {
			c.writeBuckets(&now[i], false, comment, everyBucket)
		}
	}
}

// refcounts moves the references of old to cur: the entries drawing from
// each endpoints map, the services of each endpoint address and cluster IP.
func (c *changes) refcounts(old, cur *serviceState, was, now []draw) {
	for _, d := range old.bucketDraws(was) {
		c.maps[d.mapID()] = count(c.maps, c.base.maps, d.mapID()) - 1
	}
	for _, d := range cur.bucketDraws(now) {
		c.maps[d.mapID()] = count(c.maps, c.base.maps, d.mapID()) + 1
	}
	if old != nil {
		old.eachHairpin(func(k hairpinKey) { c.hairpin.move(c.base.hairpin, k, -1) })
		for _, a := range old.ips {
			c.clusterIP.move(c.base.clusterIP, addrKeyOf(a), -1)
		}
	}
	if cur != nil {
		cur.eachHairpin(func(k hairpinKey) { c.hairpin.move(c.base.hairpin, k, 1) })
		for _, a := range cur.ips {
			c.clusterIP.move(c.base.clusterIP, addrKeyOf(a), 1)
		}
	}
}

// counts is a pending update of reference counts, in the order its keys
// were first touched.
type counts[K comparable] struct {
	m     map[K]int32
	order []K
}

func newCounts[K comparable]() counts[K] { return counts[K]{m: map[K]int32{}} }

// move adds d to the count of k, starting from the committed one.
func (p *counts[K]) move(base map[K]int32, k K, d int32) {
	n, ok := p.m[k]
	if !ok {
		n = base[k]
		p.order = append(p.order, k)
	}
	p.m[k] = n + d
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
	counted(c, setHairpin, &c.hairpin, c.base.hairpin, hairpinKey.element)
	counted(c, setClusterIPs, &c.clusterIP, c.base.clusterIP, addrKey.element)
	for _, name := range sortedKeys(c.del) {
		t.elems(c.del[name])
	}
	for _, name := range sortedKeys(c.add) {
		t.elems(c.add[name])
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

// counted adds to set the element of each key whose count rises from
// zero, and deletes that of each whose count falls to zero; key appends a
// key's element bytes.
func counted[K comparable](c *changes, set string, pending *counts[K], base map[K]int32, key func(K, *family, []byte) []byte) {
	for _, k := range pending.order {
		was, now := base[k], pending.m[k]
		if (was == 0) == (now == 0) {
			continue
		}
		var b [48]byte
		e := element{key: key(k, c.fam, b[:0])}
		c.list(set, was > 0).add(&e)
	}
}

// element appends the address as the cluster-ips set's element key.
func (k addrKey) element(f *family, b []byte) []byte { return append(b, k.bytes(f)...) }

// hairpinKey is a local endpoint as the hairpin set keys it, the packet's
// "saddr . daddr . l4proto . dport" after DNAT when the endpoint reaches
// itself: kube-proxy's hairpin-connections key.
type hairpinKey struct {
	addr  addrKey
	proto plan.Protocol
	port  uint16
}

// element appends the hairpin set's element key.
func (k hairpinKey) element(f *family, b []byte) []byte {
	a := netip.AddrFrom16(k.addr)
	if f.addrLen == 4 {
		a = a.Unmap()
	}
	ek := ipElemKey(a, k.proto, k.port)
	return append(append(b, k.addr.bytes(f)...), ek.bytes()...)
}

// commit merges the changes into their base state.
func (c *changes) commit() {
	s := c.base
	s.services = merged(s.services, c.services, func(v *serviceState) bool { return v != nil })
	mergeCounts(s.maps, c.maps)
	mergeCounts(s.chains, c.chains)
	positive := func(n int32) bool { return n > 0 }
	s.hairpin = merged(s.hairpin, c.hairpin.m, positive)
	s.clusterIP = merged(s.clusterIP, c.clusterIP.m, positive)
	s.podCIDRs = c.podCIDRs
	s.nodeAddrs = c.nodeAddrs
	s.serviceCIDRs = c.serviceCIDRs
	s.nodeIP = c.nodeIP
	for k, v := range c.services {
		if v.ranged() {
			s.ranged[k] = struct{}{}
		} else {
			delete(s.ranged, k)
		}
	}
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

// merged writes the pending values over the committed ones, deleting
// those keep refuses, and returns the result: when nothing was committed
// (a full sync), the pending map itself, which saves copying it.
func merged[K comparable, V any](dst, pending map[K]V, keep func(V) bool) map[K]V {
	if len(dst) == 0 {
		dst = pending
	}
	for k, v := range pending {
		if !keep(v) {
			delete(dst, k)
		} else {
			dst[k] = v
		}
	}
	return dst
}

func sortedKeys[K interface{ ~string | ~uint32 }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// setNamed returns a handle for one of the layout's sets or maps; element
// operations need only the name and table.
func (l *layout) setNamed(name string) *nftables.Set {
	return &nftables.Set{Table: l.table, Name: name}
}
