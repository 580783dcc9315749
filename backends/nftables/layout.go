package nftables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
)

// The layout, chosen for the kernel's cost (docs/performance.md): no per-service chains
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
	setHairpin       = "hairpin"        // local endpoint address . same address . proto . port
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

// chainNodePortsCheck refuses or drops new connections to node ports
// without (local) endpoints, on the input path only, as kube-proxy's
// nodeport-endpoints-check: the node's own datagram to such a port is
// sent, and the reject's ICMP error reaches its socket.
const chainNodePortsCheck = "nodeport-endpoints-check"

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
	// templates encode the per-endpoint rules of sticky chains, by shape.
	templates [3]*ruleTemplate
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
		l.set(setHairpin, l.fam.hairpinType()),
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
	l.nodePortCheckRules(t)
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
	clusterIP := l.fam.daddrKey().in(setClusterIPs)
	t.addRule(c, clusterIP, isTCP(), rejectWithReset())
	t.addRule(c, clusterIP, l.fam.rejectUnreachable())
	t.addRule(c, l.fam.daddrKey().in(setServiceCIDRs), verdictDrop())
}

// firewallAllowSet holds, per load-balancer address and port, the source
// ranges allowed to use it.
func (l *layout) firewallAllowSet() *nftables.Set {
	s := l.set(setFirewallAllow, l.fam.allowType())
	s.Interval = true
	return s
}

// firewallRules drop new connections to a load-balancer IP from sources
// outside its loadBalancerSourceRanges, before any DNAT: those arriving
// (filter-prerouting) and the node's own (filter-output-pre-dnat), as
// kube-proxy's firewall-check.
func (l *layout) firewallRules(t *txn) {
	c := l.chain(chainFirewall)
	f := l.fam
	allow := keyOf(append(f.serviceFields(), f.saddrField())...)
	t.addRule(c, ctNew(), f.serviceKey().in(setFirewallIPs), allow.notIn(setFirewallAllow), verdictDrop())
}

// localnetRule, with localhost node ports (ok), drops packets arriving for
// 127.0.0.0/8 from anywhere but loopback, which route_localnet would
// otherwise let in. It sits in filter-prerouting only: the node's own
// packets are not arriving ones.
func (l *layout) localnetRule() (m match, ok bool) {
	if !l.opts.LocalhostNodePorts {
		return match{}, false
	}
	f := l.fam
	return join(ctNew(), f.inLoopback(f.daddrField(), true), f.inLoopback(f.saddrField(), false), verdictDrop()), true
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
	chainFilterPrerouting    = "filter-prerouting"
	chainFilterOutputPreDNAT = "filter-output-pre-dnat"
	chainNATPrerouting       = "nat-prerouting"
	chainNATOutput           = "nat-output"
	chainNATPostrouting      = "nat-postrouting"
	chainFilterInput         = "filter-input"
	chainFilterForward       = "filter-forward"
	chainFilterOutput        = "filter-output"
)

// baseHooks are the base chains and the regular chains each jumps to, in
// order. The two at priority -110 see packets before DNAT.
var baseHooks = []struct {
	name    string
	typ     nftables.ChainType
	hook    *nftables.ChainHook
	prio    int32
	targets []string
}{
	{chainFilterPrerouting, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, -110, []string{chainFirewall}},
	{chainFilterOutputPreDNAT, nftables.ChainTypeFilter, nftables.ChainHookOutput, -110, []string{chainFirewall}},
	{chainNATPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, -100, []string{chainServices}},
	{chainNATOutput, nftables.ChainTypeNAT, nftables.ChainHookOutput, -100, []string{chainServices}},
	{chainNATPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, 100, []string{chainMasquerade}},
	{chainFilterInput, nftables.ChainTypeFilter, nftables.ChainHookInput, -10, []string{chainEPCheck, chainNodePortsCheck}},
	{chainFilterForward, nftables.ChainTypeFilter, nftables.ChainHookForward, -10, []string{chainEPCheck}},
	{chainFilterOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, -10, []string{chainEPCheck}},
}

func (l *layout) baseChains(t *txn) {
	for _, c := range []*nftables.Chain{l.chain(chainServices), l.chain(chainMasquerade), l.chain(chainEPCheck),
		l.chain(chainNodePortsCheck), l.chain(chainFirewall), l.chain(chainClusterIPsCheck)} {
		l.addChain(t, c)
	}
	for _, h := range baseHooks {
		c := l.baseChain(h.name, h.typ, h.hook, h.prio)
		l.addChain(t, c)
		if m, ok := l.localnetRule(); ok && h.name == chainFilterPrerouting {
			t.addRule(c, m)
		}
		for _, target := range h.targets {
			t.addRule(c, jumpTo(target))
		}
		if h.name == chainFilterForward || h.name == chainFilterOutput {
			// After DNAT, as kube-proxy's filter-forward and
			// filter-output-post-dnat are.
			t.addRule(c, ctNew(), jumpTo(chainClusterIPsCheck))
		}
	}
}

func (l *layout) serviceRules(t *txn) {
	c := l.chain(chainServices)
	l.shortCircuitRules(t, c)
	t.addRule(c, l.fam.serviceKey().vmap(setServiceIPs))
	t.addRule(c, l.nodePortMatch(), nodePortKey().vmap(setNodePorts))
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
func (l *layout) nodePortMatch() match {
	parts := []match{toLocal()}
	restricted := l.nodePortsRestricted()
	if !l.opts.LocalhostNodePorts || restricted {
		parts = append(parts, l.fam.inLoopback(l.fam.daddrField(), false))
	}
	if restricted {
		parts = append(parts, l.fam.daddrKey().in(setNodePortCIDRs))
	}
	return join(parts...)
}

func (l *layout) masqueradeRules(t *txn) {
	c := l.chain(chainMasquerade)
	t.addRule(c, markedForMasquerade(), unmarkMasquerade(), masqueradeFully())
	hairpin := keyOf(append([]field{l.fam.saddrField()}, l.fam.serviceFields()...)...).in(setHairpin)
	t.addRule(c, ctDNATed(), hairpin, masqueradeFully())
}

// endpointCheckRules refuse or drop new connections to cluster, external
// and load-balancer IPs without (local) endpoints, on every path.
func (l *layout) endpointCheckRules(t *txn) {
	c := l.chain(chainEPCheck)
	l.refuseRules(t, c, join(ctNew(), l.fam.serviceKey().in(setNoEPIPs)))
	t.addRule(c, ctNew(), l.fam.serviceKey().in(setDropIPs), verdictDrop())
}

// nodePortCheckRules refuse or drop new connections to node ports without
// (local) endpoints, only on the addresses that serve node ports; their
// chain is jumped to from filter-input only.
func (l *layout) nodePortCheckRules(t *txn) {
	c := l.chain(chainNodePortsCheck)
	nodePorts := l.nodePortMatch()
	l.refuseRules(t, c, join(ctNew(), nodePorts, nodePortKey().in(setNoEPNodePorts)))
	t.addRule(c, ctNew(), nodePorts, nodePortKey().in(setDropNodePorts), verdictDrop())
}

// refuseRules append to c the rejects of what m matches. A TCP reset is
// refused at once even when the client's connect() is still holding its
// socket (veth delivers the ICMP error synchronously and TCP then treats it
// as soft); everything else gets ICMP port unreachable.
func (l *layout) refuseRules(t *txn, c *nftables.Chain, m match) {
	t.addRule(c, m, isTCP(), rejectWithReset())
	t.addRule(c, m, l.fam.rejectUnreachable())
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
	switch {
	case l.opts.MasqueradeAll:
		return ruleOf(markMasquerade())
	case l.opts.LocalDetector == backends.DetectNodeCIDR:
		return ruleOf(l.fam.saddrKey().notIn(setPodCIDRs), markMasquerade())
	case l.opts.LocalDetector == backends.DetectInterfaceNamePrefix:
		return ruleOf(iifname(l.opts.PodInterfacePrefix, false), markMasquerade())
	case len(l.opts.ClusterCIDRs) > 0:
		return ruleOf(l.fam.saddrKey().notIn(setClusterCIDRs), markMasquerade())
	}
	return nil
}
