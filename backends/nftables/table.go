package nftables

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// table is one family's table: its layout and what was committed to it.
type table struct {
	layout *layout
	state  *state
	// synced is false until a full sync succeeds; partial syncs before that
	// are promoted to full ones.
	synced bool
}

// newTables returns the IPv4 and IPv6 tables, each with the options that
// concern its family.
func newTables(opts Options) []*table {
	var out []*table
	for _, f := range []*family{famV4, famV6} {
		o := opts
		o.ClusterCIDRs = prefixesOf(f, opts.ClusterCIDRs)
		o.NodePortCIDRs = prefixesOf(f, opts.NodePortCIDRs)
		restricted := len(opts.NodePortCIDRs) > 0 && len(o.NodePortCIDRs) == 0
		o.LocalhostNodePorts = opts.LocalhostNodePorts && f == famV4
		l := &layout{table: &nftables.Table{Name: opts.Table, Family: f.table}, fam: f, opts: o, noNodePorts: restricted}
		out = append(out, &table{layout: l, state: newState()})
	}
	return out
}

// prefixesOf returns the prefixes of family f, masked, without those that
// another one covers (interval sets refuse overlapping elements, which
// failed the whole commit), in address order.
func prefixesOf(f *family, in []netip.Prefix) []netip.Prefix {
	var fam []netip.Prefix
	for _, p := range in {
		if f.is(p.Addr()) {
			fam = append(fam, p.Masked())
		}
	}
	slices.SortFunc(fam, func(a, b netip.Prefix) int { return cmp.Or(a.Bits()-b.Bits(), a.Addr().Compare(b.Addr())) })
	var out []netip.Prefix
	for _, p := range fam {
		if !slices.ContainsFunc(out, p.Overlaps) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// fullTxn builds the transaction that rewrites the whole table from p. The
// first one of a process, and the first after a failed commit, replace the
// table outright. Later ones empty and refill every object instead, keeping
// the table and the affinity set, so ClientIP
// affinity survives periodic full syncs. Every object the refill deletes or
// needs is added first (adding an existing object changes nothing), so a
// refill also recreates what another process deleted. With out set the
// transaction is encoded into it as it is built (see txn).
func (tb *table) fullTxn(p *plan.Plan, out *batch) (*txn, *changes) {
	l := tb.layout
	t := &txn{table: l.table, out: out}
	if !tb.synced {
		// Adding first makes the delete valid when the table does not exist yet.
		t.add(op{kind: opAddTable})
		t.add(op{kind: opDelTable})
	}
	l.base(t, tb.synced)
	if tb.synced {
		for _, spec := range sortedSpecs(tb.state.chains) {
			t.add(op{kind: opAddChain, chain: l.chain(spec.chain())})
			l.delPickChain(t, spec)
		}
		for _, m := range sortedMaps(tb.state.maps) {
			l.addEndpointsMap(t, m)
			l.delEndpointsMap(t, m)
		}
		tb.dropStickyChains(t)
	}
	c := newChanges(newState(), l)
	c.presize(p)
	c.nodeIP = tb.nodeIP(p)
	for _, k := range p.Keys() {
		c.update(k, p.Services[k])
	}
	c.write(t, l)
	tb.writeNodeSets(t, c, p, true)
	return t, c
}

// dropStickyChains appends, to a refill, the deletion of every sticky chain
// committed; the refill writes those it needs again.
func (tb *table) dropStickyChains(t *txn) {
	l := tb.layout
	for _, k := range sortedServices(tb.state.services) {
		for _, name := range slices.Sorted(maps.Keys(tb.state.services[k].sticky())) {
			t.add(op{kind: opAddChain, chain: l.chain(name)})
			t.add(op{kind: opDelChain, chain: l.chain(name)})
		}
	}
}

func sortedServices(m map[plan.Key]*serviceState) []plan.Key {
	return slices.SortedFunc(maps.Keys(m), plan.Key.Compare)
}

func sortedServiceKeys(m map[plan.Key]struct{}) []plan.Key {
	return slices.SortedFunc(maps.Keys(m), plan.Key.Compare)
}

// nodeIP returns the node's IP of the table's family in p.
func (tb *table) nodeIP(p *plan.Plan) netip.Addr {
	return backends.NodeIP(p.Node, tb.layout.fam.number() == 6)
}

// partialTxn builds the transaction for the changed keys only, and for
// the services with source ranges when the node's IP changed.
func (tb *table) partialTxn(p *plan.Plan, changed []plan.Key, out *batch) (*txn, *changes) {
	t := &txn{table: tb.layout.table, out: out}
	c := newChanges(tb.state, tb.layout)
	c.nodeIP = tb.nodeIP(p)
	seen := make(map[plan.Key]bool, len(changed))
	update := func(k plan.Key) {
		if !seen[k] {
			seen[k] = true
			c.update(k, p.Services[k])
		}
	}
	for _, k := range changed {
		update(k)
	}
	if c.nodeIP != tb.state.nodeIP {
		for _, k := range sortedServiceKeys(tb.state.ranged) {
			update(k)
		}
	}
	c.write(t, tb.layout)
	tb.writeNodeSets(t, c, p, false)
	return t, c
}

// writeNodeSets keeps the sets that follow the Node object up to date: its
// podCIDRs (local detection by NodeCIDR) and its addresses
// (nodePortAddresses primary), of the table's family; and the service
// CIDRs of the plan.
func (tb *table) writeNodeSets(t *txn, c *changes, p *plan.Plan, full bool) {
	opts, f := tb.layout.opts, tb.layout.fam
	if opts.LocalDetector == backends.DetectNodeCIDR {
		c.podCIDRs = prefixesOf(f, p.Node.PodCIDRs)
		tb.refillSet(t, setPodCIDRs, c.podCIDRs, c.base.podCIDRs, full)
	}
	if opts.NodePortPrimary {
		var hosts []netip.Prefix
		for _, a := range p.Node.Addresses {
			if f.is(a) {
				hosts = append(hosts, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		c.nodeAddrs = hosts
		tb.refillSet(t, setNodePortCIDRs, hosts, c.base.nodeAddrs, full)
	}
	c.serviceCIDRs = prefixesOf(f, p.ServiceCIDRs)
	tb.refillSet(t, setServiceCIDRs, c.serviceCIDRs, c.base.serviceCIDRs, full)
}

// refillSet replaces an interval set's contents when they changed (always
// in a full sync, where base has just created or emptied the set).
func (tb *table) refillSet(t *txn, name string, cur, old []netip.Prefix, full bool) {
	if !full && slices.Equal(cur, old) {
		return
	}
	set := tb.layout.intervalSet(name)
	if !full {
		t.add(op{kind: opFlushSet, set: set})
	}
	t.addElems(set, prefixElements(cur)...)
}
