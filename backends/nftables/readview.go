package nftables

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// reader interprets one table, as read from the kernel, by Weir's layout:
// the service-ips and service-nodeports maps send a destination to a pick
// chain, which draws one of the destination's buckets in its lane's
// endpoints-W map, or to a service port's sticky chain; the no-endpoint and
// no-local-endpoint sets refuse or drop it; the local-origin maps
// short-circuit what the node and its pods send; the firewall sets limit
// the sources of load-balancer IPs. A map counts only when the rules that
// read it, and the base chains leading to them, are the layout's.
type reader struct {
	l *layout
	d *tableDump
	v *backends.View
	// rules are the layout's rules of the base and regular chains, each
	// with whether the kernel holds it.
	rules map[string][]layoutRule
	// hooked are the base chains on their hook that jump where they must.
	hooked map[string]bool
	// picks are the pick chains whose rules are the layout's.
	picks map[string]pickSpec
	// from names the set each destination was read from; seen holds the
	// keys of every entry read, also from sets the rules do not read, so
	// the firewall and short-circuit entries of those are not anomalies.
	from map[backends.Destination]string
	seen map[string]bool
	// buckets indexes each endpoints map by its keys.
	buckets map[string]map[string]netip.AddrPort
	// sticky holds the sticky chains read so far.
	sticky map[string]*stickyRead
}

type layoutRule struct {
	*rule
	present bool
}

func newReader(l *layout, d *tableDump, v *backends.View) *reader {
	return &reader{l: l, d: d, v: v, rules: map[string][]layoutRule{}, hooked: map[string]bool{},
		picks: map[string]pickSpec{}, from: map[backends.Destination]string{}, seen: map[string]bool{},
		buckets: map[string]map[string]netip.AddrPort{}, sticky: map[string]*stickyRead{}}
}

func (r *reader) anomaly(format string, args ...any) {
	r.v.Anomalies = append(r.v.Anomalies, tableName(r.l)+": "+fmt.Sprintf(format, args...))
}

// read adds the table's destinations and anomalies to the view.
func (r *reader) read() {
	if !r.d.exists {
		r.anomaly("the table is missing: this family's services are neither forwarded nor refused")
		return
	}
	t := &txn{table: r.l.table}
	r.l.base(t, false)
	r.checkChains(t)
	r.checkSets(t)
	r.checkPicks()
	natIn := r.hooked[chainNATPrerouting]
	nodePorts := r.nodePortsServed()
	forward, input := r.hooked[chainFilterForward], r.hooked[chainFilterInput]
	r.forwardEntries(setServiceIPs, natIn && r.uses(chainServices, setServiceIPs))
	r.forwardEntries(setNodePorts, natIn && nodePorts && r.uses(chainServices, setNodePorts))
	r.unservedEntries(setNoEPIPs, backends.VerdictReject, forward && r.uses(chainEPCheck, setNoEPIPs))
	r.unservedEntries(setNoEPNodePorts, backends.VerdictReject, input && nodePorts && r.uses(chainNodePortsCheck, setNoEPNodePorts))
	r.unservedEntries(setDropIPs, backends.VerdictDrop, forward && r.uses(chainEPCheck, setDropIPs))
	r.unservedEntries(setDropNodePorts, backends.VerdictDrop, input && nodePorts && r.uses(chainNodePortsCheck, setDropNodePorts))
	// The ranges hold only when both arriving and the node's own
	// connections are checked.
	fwHooked := r.hooked[chainFilterPrerouting] && r.hooked[chainFilterOutputPreDNAT]
	r.firewall(fwHooked && r.uses(chainFirewall, setFirewallIPs))
	local := natIn && r.hooked[chainNATOutput]
	r.shortCircuit(setShortIPs, local && r.uses(chainServices, setShortIPs))
	r.shortCircuit(setShortNodePorts, local && nodePorts && r.uses(chainServices, setShortNodePorts))
	r.checkClusterIPs()
}

// checkClusterIPs compares the cluster-ips set with the cluster IPs of the
// destinations read from this table: a cluster IP missing from it has its
// unserved ports dropped instead of refused, and an address it holds
// that no destination has is refused on every port.
func (r *reader) checkClusterIPs() {
	held := map[netip.Addr]bool{}
	for _, e := range r.d.elems[setClusterIPs] {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			held[a] = true
		}
	}
	want := map[netip.Addr]bool{}
	for d := range r.v.Destinations {
		if d.Kind == backends.DestCluster && r.l.fam.is(d.Addr) {
			want[d.Addr] = true
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
		if !held[a] {
			r.anomaly("set %s lacks cluster IP %s: its unserved ports are not refused", setClusterIPs, a)
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(held), netip.Addr.Compare) {
		if !want[a] {
			r.anomaly("set %s holds %s, which no service has: every port of it is refused", setClusterIPs, a)
		}
	}
}

// checkChains compares the base and regular chains with the layout's, in
// t (the base objects of a first full sync).
func (r *reader) checkChains(t *txn) {
	var want []*nftables.Chain
	for _, o := range t.ops {
		switch o.kind {
		case opAddChain:
			want = append(want, o.chain)
		case opAddRule:
			r.rules[o.chain.Name] = append(r.rules[o.chain.Name], layoutRule{rule: o.rule})
		}
	}
	for _, c := range want {
		got, ok := r.d.chains[c.Name]
		switch {
		case !ok:
			r.anomaly("chain %s is missing", c.Name)
		case chainSpec(got) != chainSpec(c):
			r.anomaly("chain %s is hooked as%s, not as Weir's layout has it:%s", c.Name, chainSpec(got), chainSpec(c))
		default:
			r.matchRules(c.Name)
		}
	}
	for _, h := range baseHooks {
		r.hooked[h.name] = r.d.chains[h.name] != nil && r.uses(h.name, "")
	}
	for _, name := range slices.Sorted(maps.Keys(r.d.chains)) {
		if _, pick := parsePickChain(name); !pick && !isStickyChain(name) && !slices.ContainsFunc(want, func(c *nftables.Chain) bool { return c.Name == name }) {
			r.anomaly("chain %s is not Weir's", name)
		}
	}
}

// matchRules marks the layout's rules of a chain the kernel holds and
// names the ones missing, the ones Weir did not write and a changed order.
func (r *reader) matchRules(chain string) {
	got := make([]string, len(r.d.rules[chain]))
	for j, g := range r.d.rules[chain] {
		got[j] = string(ruleBytes(r.l.table.Family, g.Exprs))
	}
	used := make([]int, 0, len(got))
	for i, w := range r.rules[chain] {
		want := string(ruleBytes(r.l.table.Family, w.exprs))
		j := -1
		for k := range got {
			if got[k] == want && !slices.Contains(used, k) {
				j = k
				break
			}
		}
		if j < 0 {
			r.anomaly("chain %s lacks Weir's rule %q", chain, w.text)
			continue
		}
		r.rules[chain][i].present = true
		used = append(used, j)
	}
	for j, g := range r.d.rules[chain] {
		if !slices.Contains(used, j) {
			r.anomaly("chain %s holds a rule Weir did not write: %s", chain, summarize(g.Exprs))
		}
	}
	if !slices.IsSorted(used) {
		r.anomaly("chain %s holds Weir's rules in another order", chain)
	}
}

// uses reports whether every layout rule of chain that reads set (any
// rule when set is empty) is in the kernel, and there is one.
func (r *reader) uses(chain, set string) bool {
	n := 0
	for _, w := range r.rules[chain] {
		if set == "" || readsSet(w.exprs, set) {
			if !w.present {
				return false
			}
			n++
		}
	}
	return n > 0
}

// checkSets names the layout's sets (in t) that are missing and the sets
// that are not Weir's.
func (r *reader) checkSets(t *txn) {
	want := map[string]bool{}
	for _, o := range t.ops {
		if o.kind == opAddSet {
			want[o.set.Name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if r.d.sets[name] == nil {
			r.anomaly("set %s is missing", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.d.sets)) {
		if _, ok := parseEndpointsMap(name); !ok && !want[name] {
			r.anomaly("set %s is not Weir's", name)
		}
	}
}

// checkPicks keeps the pick chains whose rules are the layout's for the
// spec their name stands for.
func (r *reader) checkPicks() {
	for _, name := range slices.Sorted(maps.Keys(r.d.chains)) {
		spec, ok := parsePickChain(name)
		if !ok {
			continue
		}
		t := &txn{table: r.l.table}
		r.l.addPickChain(t, spec)
		var want []*rule
		for _, o := range t.ops {
			if o.kind == opAddRule {
				want = append(want, o.rule)
			}
		}
		if i := firstDifference(r.l.table.Family, want, r.d.rules[name]); i >= 0 {
			r.anomaly("pick chain %s differs from Weir's layout at rule %d", name, i+1)
			continue
		}
		r.picks[name] = spec
	}
}

// firstDifference returns the index of the first rule where got differs
// from want, or -1 when they are the same.
func firstDifference(fam nftables.TableFamily, want []*rule, got []*nftables.Rule) int {
	for i := range max(len(want), len(got)) {
		if i >= len(want) || i >= len(got) || string(ruleBytes(fam, want[i].exprs)) != string(ruleBytes(fam, got[i].Exprs)) {
			return i
		}
	}
	return -1
}

// nodePortsServed reports whether the table's node-port rules match any
// address: unrestricted, or with addresses in nodeport-cidrs.
func (r *reader) nodePortsServed() bool {
	return !r.l.nodePortsRestricted() || len(r.d.elems[setNodePortCIDRs]) > 0
}

// entryKey is a map key decoded: the address (unspecified for a node
// port), protocol and port.
type entryKey struct {
	addr  netip.Addr
	proto plan.Protocol
	port  uint16
}

func (k entryKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.addr, k.port), k.proto)
}

func (k entryKey) dest(kind backends.DestinationKind) backends.Destination {
	return backends.Destination{Kind: kind, Addr: k.addr, Protocol: k.proto, Port: k.port}
}

// portKeyed reports whether a set's keys are "protocol . port".
func portKeyed(set string) bool {
	switch set {
	case setNodePorts, setNoEPNodePorts, setDropNodePorts, setShortNodePorts:
		return true
	}
	return false
}

// decodeKey decodes an element key of set; false (after naming it as an
// anomaly) when it is malformed.
func (r *reader) decodeKey(set string, key []byte) (entryKey, bool) {
	n, off := int(r.l.fam.addrLen), int(r.l.fam.addrLen)
	k := entryKey{addr: netip.IPv4Unspecified()}
	if r.l.fam == famV6 {
		k.addr = netip.IPv6Unspecified()
	}
	if portKeyed(set) {
		n, off = 0, 0
	}
	if len(key) != n+8 {
		r.anomaly("%s holds an element with a malformed key %x", set, key)
		return k, false
	}
	if n > 0 {
		k.addr = addrAt(key, 0, n)
	}
	k.proto, k.port = protocolOf(key[off]), binary.BigEndian.Uint16(key[off+4:])
	if k.proto == "" {
		r.anomaly("%s holds an element for protocol %d, which Weir does not serve", set, key[off])
		return k, false
	}
	r.seen[string(key)] = true
	return k, true
}

func protocolOf(n byte) plan.Protocol {
	for _, p := range []plan.Protocol{plan.TCP, plan.UDP, plan.SCTP} {
		if m, _ := protoNumber(p); m == n {
			return p
		}
	}
	return ""
}

// put records a destination's forwarding read from set; the first entry
// wins, as the kernel's first matching rule does.
func (r *reader) put(set string, d backends.Destination, f backends.Forwarding) {
	if prev, ok := r.from[d]; ok {
		r.anomaly("%s is in both %s and %s", d, prev, set)
		return
	}
	r.from[d], r.v.Destinations[d] = set, f
}

// pickKinds says which pick chains each verdict map may send to, and the
// kind of destination that makes its keys.
var pickKinds = map[string]map[pickKind]backends.DestinationKind{
	setServiceIPs:     {pickCluster: backends.DestCluster, pickExternal: backends.DestExternal, pickExternalLocal: backends.DestExternal},
	setNodePorts:      {pickNodePort: backends.DestNodePort, pickNodePortLocal: backends.DestNodePort},
	setShortIPs:       {pickShortIP: backends.DestExternal},
	setShortNodePorts: {pickShortNP: backends.DestNodePort},
}

// pickEntry decodes an element of a verdict map sending a destination to a
// pick chain or a sticky chain, and returns what it draws from.
func (r *reader) pickEntry(vmap string, e nftables.SetElement) (backends.Destination, drawn, bool) {
	k, ok := r.decodeKey(vmap, e.Key)
	if !ok {
		return backends.Destination{}, drawn{}, false
	}
	chain, ok := gotoChain(e.Val)
	if !ok {
		r.anomaly("%s sends %s elsewhere than to a chain (verdict %x)", vmap, k, e.Val)
		return backends.Destination{}, drawn{}, false
	}
	if isStickyChain(chain) {
		return r.stickyEntry(vmap, k, chain)
	}
	spec, ok := r.picks[chain]
	if !ok {
		r.anomaly("%s sends %s to chain %s, which does not hold Weir's rules for a pick chain", vmap, k, chain)
		return backends.Destination{}, drawn{}, false
	}
	kind, ok := pickKinds[vmap][spec.kind]
	if !ok {
		r.anomaly("%s sends %s to %s, a pick chain for other traffic", vmap, k, chain)
		return backends.Destination{}, drawn{}, false
	}
	return k.dest(kind), drawn{spec: spec}, true
}

// drawn is what an entry's chain draws from: the entry's buckets in a pick
// chain's endpoints map, or the endpoints a sticky chain holds.
type drawn struct {
	spec   pickSpec
	sticky *stickyRead
}

// stickyEntry returns what a sticky chain that vmap sends k to draws from.
func (r *reader) stickyEntry(vmap string, k entryKey, chain string) (backends.Destination, drawn, bool) {
	s, ok := r.sticky[chain]
	if !ok {
		s = r.readSticky(vmap, chain)
		r.sticky[chain] = s
	}
	if s == nil {
		r.anomaly("%s sends %s to chain %s, which does not hold Weir's rules for a sticky chain", vmap, k, chain)
		return backends.Destination{}, drawn{}, false
	}
	return k.dest(pickKinds[vmap][s.kind]), drawn{sticky: s}, true
}

// gotoChain decodes a verdict map element's data: the chain of a goto.
func gotoChain(val []byte) (string, bool) {
	ad, err := netlink.NewAttributeDecoder(val)
	if err != nil {
		return "", false
	}
	ad.ByteOrder = binary.BigEndian
	var code int32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	return chain, ad.Err() == nil && code == unix.NFT_GOTO && chain != ""
}

// forwardEntries reads a verdict map of destinations that are forwarded;
// with on false the rules do not read it (already named as an anomaly).
func (r *reader) forwardEntries(vmap string, on bool) {
	for _, e := range r.d.elems[vmap] {
		d, from, ok := r.pickEntry(vmap, e)
		if !ok || !on {
			continue
		}
		if eps, ok := r.pool(from, e.Key, d); ok {
			r.put(vmap, d, backends.Forwarding{Verdict: backends.VerdictForward, Endpoints: eps, AffinitySeconds: from.affinity()})
		}
	}
}

func (d drawn) affinity() uint32 {
	if d.sticky != nil {
		return d.sticky.timeout
	}
	return 0
}

// pool returns the endpoints, with their numbers of buckets, that the
// chain an entry of key goes to draws from. False (after naming the
// anomaly) when nothing can be drawn.
func (r *reader) pool(from drawn, key []byte, d backends.Destination) (map[netip.AddrPort]uint32, bool) {
	eps := map[netip.AddrPort]uint32{}
	if from.sticky != nil {
		for _, w := range from.sticky.eps {
			eps[w.ep] += w.n
		}
		return eps, true
	}
	w := from.spec.weight
	m := mapID{lane: from.spec.kind.lane(), weight: w}.name()
	buckets := r.bucketsOf(m)
	var missing []uint32
	for b := range w {
		if ep, ok := buckets[string(bucketKey(key, b))]; ok {
			eps[ep]++
		} else {
			missing = append(missing, b)
		}
	}
	switch {
	case len(eps) == 0:
		r.anomaly("%s has no buckets in %s; connections are not translated", d, m)
		return nil, false
	case len(missing) > 0:
		r.anomaly("%s lacks buckets %v of %s; connections drawing them are not translated", d, missing, m)
	}
	return eps, true
}

// bucketsOf indexes an endpoints map by its keys.
func (r *reader) bucketsOf(name string) map[string]netip.AddrPort {
	if m, ok := r.buckets[name]; ok {
		return m
	}
	n := int(r.l.fam.addrLen)
	m := map[string]netip.AddrPort{}
	for _, e := range r.d.elems[name] {
		if len(e.Val) < n+2 {
			r.anomaly("%s holds a malformed element %x : %x", name, e.Key, e.Val)
			continue
		}
		m[string(e.Key)] = netip.AddrPortFrom(addrAt(e.Val, 0, n), binary.BigEndian.Uint16(e.Val[n:]))
	}
	r.buckets[name] = m
	return m
}

// unservedEntries reads a set of destinations that are refused or dropped.
func (r *reader) unservedEntries(set string, verdict backends.Verdict, on bool) {
	for _, e := range r.d.elems[set] {
		k, ok := r.decodeKey(set, e.Key)
		if !ok || !on {
			continue
		}
		kind := backends.DestCluster
		switch {
		case portKeyed(set):
			kind = backends.DestNodePort
		case isExternal(e.Comment):
			kind = backends.DestExternal
		}
		r.put(set, k.dest(kind), backends.Forwarding{Verdict: verdict})
	}
}

// firewall reads the load-balancer IPs with source ranges: firewall-ips
// lists them, firewall-allow the ranges allowed to reach each.
func (r *reader) firewall(on bool) {
	n := int(r.l.fam.addrLen)
	allowed := map[string][]netip.Prefix{}
	for _, e := range r.d.elems[setFirewallAllow] {
		if len(e.Key) != 2*n+8 || len(e.KeyEnd) != len(e.Key) || string(e.Key[:n+8]) != string(e.KeyEnd[:n+8]) {
			r.anomaly("%s holds a malformed element %x-%x", setFirewallAllow, e.Key, e.KeyEnd)
			continue
		}
		first, last := addrAt(e.Key, n+8, n), addrAt(e.KeyEnd, n+8, n)
		p, ok := rangePrefix(first, last)
		if !ok {
			r.anomaly("%s allows %s-%s, which is not a CIDR", setFirewallAllow, first, last)
			continue
		}
		allowed[string(e.Key[:n+8])] = append(allowed[string(e.Key[:n+8])], p)
	}
	for _, e := range r.d.elems[setFirewallIPs] {
		elsewhere := r.seen[string(e.Key)]
		k, ok := r.decodeKey(setFirewallIPs, e.Key)
		if !ok || !on {
			continue
		}
		d := k.dest(backends.DestExternal)
		f, ok := r.v.Destinations[d]
		if !ok {
			if !elsewhere {
				r.anomaly("%s limits the sources of %s, which no other set of Weir's holds", setFirewallIPs, d)
			}
			continue
		}
		f.Allowed = append([]netip.Prefix{}, allowed[string(e.Key)]...)
		r.v.Destinations[d] = f
	}
}

// rangePrefix returns the CIDR that spans exactly first to last.
func rangePrefix(first, last netip.Addr) (netip.Prefix, bool) {
	for bits := range first.BitLen() + 1 {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() == first && lastAddr(p) == last {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// shortCircuit reads a local-origin verdict map: the endpoints that
// connections from the node and its pods to a destination reach.
func (r *reader) shortCircuit(vmap string, on bool) {
	for _, e := range r.d.elems[vmap] {
		elsewhere := r.seen[string(e.Key)]
		d, from, ok := r.pickEntry(vmap, e)
		if !ok || !on {
			continue
		}
		f, ok := r.v.Destinations[d]
		if !ok {
			if !elsewhere {
				r.anomaly("%s short-circuits %s, which no other set of Weir's holds", vmap, d)
			}
			continue
		}
		if eps, ok := r.pool(from, e.Key, d); ok {
			f.ShortCircuit = eps
			r.v.Destinations[d] = f
		}
	}
}
