package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/backends"
)

// The layout, chosen for the kernel's cost (DESIGN §7): no per-service chains
// or rules, except for ClientIP affinity (sticky.go). Verdict maps send a
// destination's packets to a shared "pick" chain per kind and total weight
// W; that chain's single rule draws a bucket with numgen random mod W and
// DNATs to the endpoint the endpoints-W map stores for the destination's
// key and that bucket. Each map is read by a few rules only, so loading 10k
// services costs element insertions only, and changing one endpoint is an
// element replacement per destination. Every rule is one the nft tool can
// list: no lookup key holds another lookup's result.
const (
	chainServices    = "services"
	chainMasquerade  = "masquerading"
	chainEPCheck     = "endpoints-check"
	setServiceIPs    = "service-ips"       // daddr . proto . port : goto pick-ip-W
	setNodePorts     = "service-nodeports" // proto . port : goto pick-np-W
	setNoEPIPs       = "no-endpoint-ips"
	setNoEPNodePorts = "no-endpoint-nodeports"
	setDropIPs       = "no-local-endpoint-ips"       // endpoints exist, none for this traffic: drop
	setDropNodePorts = "no-local-endpoint-nodeports" // the same for node ports
	setClusterCIDRs  = "cluster-cidrs"
	setPodCIDRs      = "pod-cidrs" // this Node's spec.podCIDRs, for DetectNodeCIDR
	setNodePortCIDRs = "nodeport-cidrs"
	setHairpin       = "hairpin"        // endpoint address . same address
	setFirewallIPs   = "firewall-ips"   // load-balancer IP . proto . port with source ranges
	setFirewallAllow = "firewall-allow" // the same . allowed source range (intervals)
	chainFirewall    = "firewall-check"
	// The cluster-IP checks, kube-proxy's: a new connection still headed
	// for a cluster IP after DNAT asked for a port no service serves, one
	// headed for another address of the service CIDRs for no service.
	chainClusterIPsCheck = "cluster-ips-check"
	setClusterIPs        = "cluster-ips"   // every cluster IP of the family
	setServiceCIDRs      = "service-cidrs" // the plan's service CIDRs (intervals)
)

// portKeyType is the key of node-port entries. Bucket numbers are typed
// mark, an integer type of a known size: nft cannot list a concatenation
// with its sizeless integer type.
var portKeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)

// layout builds the kernel objects of one table.
type layout struct {
	table *nftables.Table
	fam   *family
	opts  Options
	// noNodePorts is set when nodePortAddresses lists only CIDRs of the
	// other family: this table serves no node port.
	noNodePorts bool
	// refill is set while base rewrites objects that may already exist.
	refill bool
}

func (l *layout) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: l.table}
}

// baseChain returns a chain on a netfilter hook. Its policy is always
// stated, so that a refill also undoes a policy another process set.
func (l *layout) baseChain(name string, t nftables.ChainType, hook *nftables.ChainHook, prio int32) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: name, Table: l.table, Type: t, Hooknum: hook,
		Priority: nftables.ChainPriorityRef(nftables.ChainPriority(prio)), Policy: &accept}
}

func (l *layout) set(name string, key nftables.SetDatatype) *nftables.Set {
	return &nftables.Set{Table: l.table, Name: name, KeyType: key, Concatenation: strings.Contains(key.Name, " . ")}
}

func (l *layout) dataMap(name string, key, data nftables.SetDatatype) *nftables.Set {
	s := l.set(name, key)
	s.IsMap, s.DataType = true, data
	return s
}

func (l *layout) intervalSet(name string) *nftables.Set {
	s := l.set(name, l.fam.addrType)
	s.Interval = true
	return s
}

// base appends the table and every object that does not depend on services.
// With refill set the objects may exist already: each is emptied after being
// ensured, except the affinity set, whose clients keep their endpoints.
func (l *layout) base(t *txn, refill bool) {
	t.add(op{kind: opAddTable})
	l.refill = refill
	defer func() { l.refill = false }()
	for _, s := range []*nftables.Set{
		l.dataMap(setServiceIPs, l.fam.ipKeyType(), nftables.TypeVerdict),
		l.dataMap(setNodePorts, portKeyType, nftables.TypeVerdict),
		l.set(setNoEPIPs, l.fam.ipKeyType()),
		l.set(setNoEPNodePorts, portKeyType),
		l.set(setDropIPs, l.fam.ipKeyType()),
		l.set(setDropNodePorts, portKeyType),
		l.set(setHairpin, l.fam.addrAddrType()),
		l.dataMap(setShortIPs, l.fam.ipKeyType(), nftables.TypeVerdict),
		l.dataMap(setShortNodePorts, portKeyType, nftables.TypeVerdict),
		l.set(setFirewallIPs, l.fam.ipKeyType()),
		l.firewallAllowSet(),
		l.set(setClusterIPs, l.fam.addrType),
		l.intervalSet(setServiceCIDRs),
	} {
		l.addSet(t, s)
	}
	// The affinity entries outlive a refill: clients keep their endpoints.
	t.add(op{kind: opAddSet, set: l.affinitySet()})
	l.cidrSets(t)
	l.baseChains(t)
	l.serviceRules(t)
	l.masqueradeRules(t)
	l.endpointCheckRules(t)
	l.clusterIPsCheckRules(t)
	l.firewallRules(t)
}

// clusterIPsCheckRules reject new connections to a cluster IP on a port no
// service serves (the ones it serves were DNATed before this hook) and drop
// those to an address of the service CIDRs that no service has. As for
// services without endpoints, TCP gets a reset and the rest ICMP port
// unreachable, where kube-proxy's plain reject sends ICMP to TCP too: the
// client sees the same refusal.
func (l *layout) clusterIPsCheckRules(t *txn) {
	c := l.chain(chainClusterIPsCheck)
	daddrIn := func(set string) []expr.Any { return []expr.Any{l.fam.loadDaddr(regKey), lookup(regKey, set, false)} }
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  "ip daddr @" + setClusterIPs + " meta l4proto tcp reject with tcp reset",
		exprs: append(append(daddrIn(setClusterIPs), isTCP()...), rejectTCPReset()),
	}})
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  "ip daddr @" + setClusterIPs + " reject",
		exprs: append(daddrIn(setClusterIPs), l.fam.rejectPortUnreachable()),
	}})
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  "ip daddr @" + setServiceCIDRs + " drop",
		exprs: append(daddrIn(setServiceCIDRs), drop()),
	}})
}

// firewallAllowSet holds, per load-balancer address and port, the source
// ranges allowed to use it.
func (l *layout) firewallAllowSet() *nftables.Set {
	s := l.set(setFirewallAllow, l.fam.allowType())
	s.Interval = true
	return s
}

// firewallRules drop new connections to a load-balancer IP from sources
// outside its loadBalancerSourceRanges, before any DNAT; with localhost node
// ports, also packets to 127.0.0.0/8 from anywhere but loopback, which
// route_localnet would otherwise let in.
func (l *layout) firewallRules(t *txn) {
	c := l.chain(chainFirewall)
	if l.opts.LocalhostNodePorts {
		t.add(op{kind: opAddRule, chain: c, rule: &rule{
			text:  "ct state new ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 drop",
			exprs: append(append(append(ctStateNew(), l.fam.addrInLoopback(l.fam.loadDaddr(regScratch), true)...), l.fam.addrInLoopback(l.fam.loadSaddr(regScratch), false)...), drop()),
		}})
	}
	exprs := append(append(ctStateNew(), l.fam.ipKeyExprs()...), lookup(regKey, setFirewallIPs, false),
		l.fam.loadSaddr(regKey+l.fam.addrWords()+2), lookup(regKey, setFirewallAllow, true), drop())
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text: fmt.Sprintf("ct state new ip daddr . meta l4proto . th dport @%s ip daddr . meta l4proto . th dport . ip saddr != @%s drop",
			setFirewallIPs, setFirewallAllow),
		exprs: exprs,
	}})
}

// addSet ensures a set exists and, when refilling, empties it.
func (l *layout) addSet(t *txn, s *nftables.Set) {
	t.add(op{kind: opAddSet, set: s})
	if l.refill {
		t.add(op{kind: opFlushSet, set: s})
	}
}

// addChain ensures a chain exists and, when refilling, empties it.
func (l *layout) addChain(t *txn, c *nftables.Chain) {
	t.add(op{kind: opAddChain, chain: c})
	if l.refill {
		t.add(op{kind: opFlushChain, chain: c})
	}
}

func (l *layout) cidrSets(t *txn) {
	if len(l.opts.ClusterCIDRs) > 0 {
		s := l.intervalSet(setClusterCIDRs)
		l.addSet(t, s)
		t.addElems(s, prefixElements(l.opts.ClusterCIDRs)...)
	}
	if l.opts.LocalDetector == backends.DetectNodeCIDR {
		l.addSet(t, l.intervalSet(setPodCIDRs))
	}
	if l.opts.NodePortPrimary || l.noNodePorts {
		// Filled from the node's addresses, or left empty.
		l.addSet(t, l.intervalSet(setNodePortCIDRs))
	} else if len(l.opts.NodePortCIDRs) > 0 {
		s := l.intervalSet(setNodePortCIDRs)
		l.addSet(t, s)
		t.addElems(s, prefixElements(l.opts.NodePortCIDRs)...)
	}
}

// The base chains: each hooks one netfilter hook and jumps to a regular
// chain.
const (
	chainFilterPrerouting = "filter-prerouting"
	chainNATPrerouting    = "nat-prerouting"
	chainNATOutput        = "nat-output"
	chainNATPostrouting   = "nat-postrouting"
	chainFilterInput      = "filter-input"
	chainFilterForward    = "filter-forward"
	chainFilterOutput     = "filter-output"
)

var baseHooks = []struct {
	name   string
	typ    nftables.ChainType
	hook   *nftables.ChainHook
	prio   int32
	target string
}{
	{chainFilterPrerouting, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, -110, chainFirewall},
	{chainNATPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, -100, chainServices},
	{chainNATOutput, nftables.ChainTypeNAT, nftables.ChainHookOutput, -100, chainServices},
	{chainNATPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, 100, chainMasquerade},
	{chainFilterInput, nftables.ChainTypeFilter, nftables.ChainHookInput, -10, chainEPCheck},
	{chainFilterForward, nftables.ChainTypeFilter, nftables.ChainHookForward, -10, chainEPCheck},
	{chainFilterOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, -10, chainEPCheck},
}

func (l *layout) baseChains(t *txn) {
	for _, c := range []*nftables.Chain{l.chain(chainServices), l.chain(chainMasquerade), l.chain(chainEPCheck),
		l.chain(chainFirewall), l.chain(chainClusterIPsCheck)} {
		l.addChain(t, c)
	}
	for _, h := range baseHooks {
		c := l.baseChain(h.name, h.typ, h.hook, h.prio)
		l.addChain(t, c)
		t.add(op{kind: opAddRule, chain: c, rule: &rule{text: "jump " + h.target, exprs: []expr.Any{jump(h.target)}}})
		if h.name == chainFilterForward || h.name == chainFilterOutput {
			// After DNAT, as kube-proxy's filter-forward and
			// filter-output-post-dnat are.
			t.add(op{kind: opAddRule, chain: c, rule: &rule{text: "ct state new jump " + chainClusterIPsCheck,
				exprs: append(ctStateNew(), jump(chainClusterIPsCheck))}})
		}
	}
}

func (l *layout) serviceRules(t *txn) {
	c := l.chain(chainServices)
	l.shortCircuitRules(t, c)
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  "ip daddr . meta l4proto . th dport vmap @" + setServiceIPs,
		exprs: append(l.fam.ipKeyExprs(), mapTo(regKey, setServiceIPs, regVerdict)),
	}})
	exprs, text := l.nodePortMatch()
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  text + "meta l4proto . th dport vmap @" + setNodePorts,
		exprs: append(append(exprs, portKeyExprs()...), mapTo(regKey, setNodePorts, regVerdict)),
	}})
}

// nodePortsRestricted reports whether node ports are served only on the
// addresses in the nodeport-cidrs set.
func (l *layout) nodePortsRestricted() bool {
	return len(l.opts.NodePortCIDRs) > 0 || l.opts.NodePortPrimary || l.noNodePorts
}

// servesNodePorts reports whether the table serves node ports on any
// address, given the Node's addresses.
func (l *layout) servesNodePorts(nodeAddrs []netip.Addr) bool {
	switch {
	case l.noNodePorts:
		return false
	case l.opts.NodePortPrimary:
		return slices.ContainsFunc(nodeAddrs, l.fam.is)
	}
	return true
}

// nodePortMatch matches destinations that accept node ports.
func (l *layout) nodePortMatch() ([]expr.Any, string) {
	exprs, text := daddrLocal(), "fib daddr type local "
	restricted := l.nodePortsRestricted()
	if !l.opts.LocalhostNodePorts || restricted {
		exprs, text = append(exprs, l.fam.daddrNotLoopback()...), text+"ip daddr != "+l.fam.loopback.String()+" "
	}
	if restricted {
		exprs = append(exprs, l.fam.loadDaddr(regKey), lookup(regKey, setNodePortCIDRs, false))
		text += "ip daddr @" + setNodePortCIDRs + " "
	}
	return exprs, text
}

func (l *layout) masqueradeRules(t *txn) {
	c := l.chain(chainMasquerade)
	exprs := append(markBitSet(masqueradeMark), setMarkBit(masqueradeMark, true)...)
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  fmt.Sprintf("meta mark & %#x != 0 meta mark set meta mark & %#x masquerade fully-random", masqueradeMark, ^uint32(masqueradeMark)),
		exprs: append(exprs, masquerade()),
	}})
	exprs = append(ctStatusDNAT(), l.fam.loadSaddr(regKey), l.fam.loadDaddr(regKey+l.fam.addrWords()), lookup(regKey, setHairpin, false), masquerade())
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  "ct status dnat ip saddr . ip daddr @" + setHairpin + " masquerade fully-random",
		exprs: exprs,
	}})
}

// endpointCheckRules refuse or drop new connections to destinations without
// (local) endpoints; node ports only on the addresses that serve node ports.
func (l *layout) endpointCheckRules(t *txn) {
	c := l.chain(chainEPCheck)
	npMatch, npText := l.nodePortMatch()
	nodePorts := func(set string) []expr.Any {
		return append(append(append(ctStateNew(), clone(npMatch)...), portKeyExprs()...), lookup(regKey, set, false))
	}
	matches := []struct {
		text  string
		exprs []expr.Any
	}{
		{"ct state new ip daddr . meta l4proto . th dport @" + setNoEPIPs,
			append(append(ctStateNew(), l.fam.ipKeyExprs()...), lookup(regKey, setNoEPIPs, false))},
		{"ct state new " + npText + "meta l4proto . th dport @" + setNoEPNodePorts, nodePorts(setNoEPNodePorts)},
	}
	// A TCP reset is refused at once even when the client's connect() is
	// still holding its socket (veth delivers the ICMP error synchronously and
	// TCP then treats it as soft); everything else gets ICMP port unreachable.
	for _, m := range matches {
		t.add(op{kind: opAddRule, chain: c, rule: &rule{
			text:  m.text + " meta l4proto tcp reject with tcp reset",
			exprs: append(append(slices.Clone(m.exprs), isTCP()...), rejectTCPReset()),
		}})
		t.add(op{kind: opAddRule, chain: c, rule: &rule{text: m.text + " reject", exprs: append(m.exprs, l.fam.rejectPortUnreachable())}})
	}
	drops := []struct {
		text  string
		exprs []expr.Any
	}{
		{"ct state new ip daddr . meta l4proto . th dport @" + setDropIPs + " drop",
			append(append(ctStateNew(), l.fam.ipKeyExprs()...), lookup(regKey, setDropIPs, false))},
		{"ct state new " + npText + "meta l4proto . th dport @" + setDropNodePorts + " drop", nodePorts(setDropNodePorts)},
	}
	for _, d := range drops {
		t.add(op{kind: opAddRule, chain: c, rule: &rule{text: d.text, exprs: append(d.exprs, drop())}})
	}
}

// endpointsMap returns an endpoints map: "entry key . bucket" to endpoint.
func (l *layout) endpointsMap(m mapID) *nftables.Set {
	key := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
	if !m.lane.portKeyed() {
		key = nftables.MustConcatSetType(l.fam.addrType, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
	}
	return l.dataMap(m.name(), key, l.fam.addrPortType())
}

// addEndpointsMap appends the map holding the buckets of every entry of
// one lane whose pool has one total weight.
func (l *layout) addEndpointsMap(t *txn, m mapID) {
	t.add(op{kind: opAddSet, set: l.endpointsMap(m)})
}

func (l *layout) delEndpointsMap(t *txn, m mapID) {
	t.add(op{kind: opDelSet, set: l.endpointsMap(m)})
}

// delPickChain removes a pick chain once no element refers to it.
func (l *layout) delPickChain(t *txn, spec pickSpec) {
	t.add(op{kind: opDelChain, chain: l.chain(spec.chain())})
}

// clusterMasqueradeRule marks cluster-IP traffic for masquerading:
// everything with masqueradeAll; otherwise traffic the local detector does
// not recognise as coming from pods; nothing when there is no detector (like
// kube-proxy without a local-traffic detector).
func (l *layout) clusterMasqueradeRule() *rule {
	mark := setMarkBit(masqueradeMark, false)
	markText := fmt.Sprintf("meta mark set meta mark | %#x", masqueradeMark)
	switch {
	case l.opts.MasqueradeAll:
		return &rule{text: markText, exprs: mark}
	case l.opts.LocalDetector == backends.DetectNodeCIDR:
		return &rule{
			text:  fmt.Sprintf("ip saddr != @%s %s", setPodCIDRs, markText),
			exprs: append([]expr.Any{l.fam.loadSaddr(regKey), lookup(regKey, setPodCIDRs, true)}, mark...),
		}
	case l.opts.LocalDetector == backends.DetectInterfaceNamePrefix:
		return &rule{
			text:  fmt.Sprintf("iifname != %q %s", l.opts.PodInterfacePrefix+"*", markText),
			exprs: append(iifnameNotPrefix(l.opts.PodInterfacePrefix), mark...),
		}
	case len(l.opts.ClusterCIDRs) > 0:
		return &rule{
			text:  fmt.Sprintf("ip saddr != @%s %s", setClusterCIDRs, markText),
			exprs: append([]expr.Any{l.fam.loadSaddr(regKey), lookup(regKey, setClusterCIDRs, true)}, mark...),
		}
	}
	return nil
}
