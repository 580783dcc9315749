package nftables

import (
	"fmt"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// pickKind says which traffic a pick chain serves, which decides how its
// packets are keyed and whether they are masqueraded.
type pickKind uint8

const (
	// pickCluster serves cluster IPs: masquerade per clusterCIDRs or masqueradeAll.
	pickCluster pickKind = iota
	// pickExternal serves external and load-balancer IPs of Cluster-policy
	// services: always masqueraded, so replies return through this node.
	pickExternal
	// pickExternalLocal serves them for Local-policy services: the client's
	// address is kept.
	pickExternalLocal
	// pickNodePort and pickNodePortLocal are the same for node ports.
	pickNodePort
	pickNodePortLocal
	// pickShortIP and pickShortNP serve node- and pod-originated traffic to
	// the external addresses of Local-policy services with the cluster's
	// endpoints (see shortcircuit.go).
	pickShortIP
	pickShortNP
)

var pickNames = [...]string{"ip", "ext", "ext-local", "np", "np-local", "short-ip", "short-np"}

// pickSpec identifies one shared pick chain: every service pool with the same
// kind, total weight and affinity timeout goes through the same chain.
type pickSpec struct {
	kind   pickKind
	weight uint32
	// affinity is the ClientIP affinity timeout in seconds; 0 for none.
	affinity uint32
}

func (p pickSpec) chain() string {
	name := fmt.Sprintf("pick-%s-%d", pickNames[p.kind], p.weight)
	if p.affinity > 0 {
		name += fmt.Sprintf("-sticky-%d", p.affinity)
	}
	return name
}

// keyExprs loads the chain's lookup key at regKey and returns the map that
// turns it into a target id.
func (p pickSpec) keyExprs() ([]expr.Any, string, string) {
	switch p.kind {
	case pickNodePort, pickNodePortLocal:
		return portKeyExprs(), setNPTargets, "meta l4proto . th dport"
	case pickShortNP:
		return portKeyExprs(), setShortNPTargets, "meta l4proto . th dport"
	case pickShortIP:
		return ipKeyExprs(), setShortIPTargets, "ip daddr . meta l4proto . th dport"
	}
	return ipKeyExprs(), setIPTargets, "ip daddr . meta l4proto . th dport"
}

// addPickChain appends the chain for spec with its rules.
func (l *layout) addPickChain(t *txn, spec pickSpec) {
	c := l.chain(spec.chain())
	t.add(op{kind: opAddChain, chain: c})
	if spec.kind == pickShortIP || spec.kind == pickShortNP {
		t.add(op{kind: opAddRule, chain: c, rule: shortCircuitMasquerade()})
	}
	if r := l.masqueradeRule(spec.kind); r != nil {
		t.add(op{kind: opAddRule, chain: c, rule: r})
	}
	if spec.kind == pickNodePortLocal && l.opts.LocalhostNodePorts {
		// A reply cannot go back to 127.0.0.1 from a pod: masquerade localhost.
		t.add(op{kind: opAddRule, chain: c, rule: &rule{
			text:  fmt.Sprintf("ip saddr 127.0.0.0/8 meta mark set meta mark | %#x", masqueradeMark),
			exprs: append(addrInLoopback(loadSaddr(regScratch), true), setMarkBit(masqueradeMark, false)...),
		}})
	}
	if spec.affinity > 0 {
		t.add(op{kind: opAddRule, chain: c, rule: stickyHitRule(spec)})
		t.add(op{kind: opAddRule, chain: c, rule: stickyNewRule(spec)})
		return
	}
	key, targets, keyText := spec.keyExprs()
	w := spec.weight
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  fmt.Sprintf("dnat to %s map @%s . numgen random mod %d map @%s", keyText, targets, w, endpointsMap(w)),
		exprs: append(append(key, mapTo(regKey, targets, regTarget)), pickAndDNAT(w, endpointsMap(w))...),
	}})
}

// masqueradeRule returns the rule marking a kind's packets for masquerading,
// or nil when they keep their source.
func (l *layout) masqueradeRule(kind pickKind) *rule {
	switch kind {
	case pickCluster, pickShortIP, pickShortNP:
		return l.clusterMasqueradeRule()
	case pickExternal, pickNodePort:
		return &rule{text: fmt.Sprintf("meta mark set meta mark | %#x", masqueradeMark), exprs: setMarkBit(masqueradeMark, false)}
	}
	return nil
}

// Registers of the sticky rules, after the key (regKey..regKey+2) is used.
const (
	regStickyTarget = 11 // target id, then the client address at 12
	regStickyData   = 13 // target . bucket, the endpoints map key
	regStickyEP     = 15 // endpoint address, then port at 16
	regStickyKey2   = 17 // target again, then the client address at 18
)

// stickyHitRule sends a client with a live affinity entry to the bucket it
// had, refreshing the entry's timeout.
func stickyHitRule(spec pickSpec) *rule {
	key, targets, keyText := spec.keyExprs()
	w := spec.weight
	exprs := append(key,
		mapTo(regKey, targets, regStickyTarget),
		loadSaddr(regStickyTarget+1),
		mapTo(regStickyTarget, setAffinity, regStickyData),
		mapTo(regStickyData, endpointsMap(w), regStickyEP),
		updateAffinity(regStickyTarget, regStickyData, spec.affinity),
		dnatTo(regStickyEP))
	return &rule{
		text: fmt.Sprintf("%s map @%s . ip saddr map @%s update @%s timeout %ds, dnat to that bucket of @%s",
			keyText, targets, setAffinity, setAffinity, spec.affinity, endpointsMap(w)),
		exprs: exprs,
	}
}

// stickyNewRule draws a bucket for a client without an entry and records it.
func stickyNewRule(spec pickSpec) *rule {
	key, targets, keyText := spec.keyExprs()
	w := spec.weight
	exprs := append(key,
		mapTo(regKey, targets, regStickyData),
		&expr.Numgen{Register: regStickyData + 1, Modulus: w, Type: unix.NFT_NG_RANDOM},
		mapTo(regStickyData, endpointsMap(w), regStickyEP),
		mapTo(regKey, targets, regStickyKey2),
		loadSaddr(regStickyKey2+1),
		updateAffinity(regStickyKey2, regStickyData, spec.affinity),
		dnatTo(regStickyEP))
	return &rule{
		text: fmt.Sprintf("%s map @%s . numgen random mod %d: record in @%s timeout %ds, dnat to that bucket of @%s",
			keyText, targets, w, setAffinity, spec.affinity, endpointsMap(w)),
		exprs: exprs,
	}
}

func updateAffinity(keyReg, dataReg, seconds uint32) expr.Any {
	return &expr.Dynset{SrcRegKey: keyReg, SrcRegData: dataReg, SetName: setAffinity,
		Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: time.Duration(seconds) * time.Second}
}

func dnatTo(reg uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg, RegProtoMin: reg + 1, Specified: true}
}
