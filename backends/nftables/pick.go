package nftables

import (
	"fmt"
	"strconv"
	"strings"
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

// parsePickChain returns the spec a pick chain's name stands for; false
// when the name is not one Weir gives a pick chain.
func parsePickChain(name string) (pickSpec, bool) {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return pickSpec{}, false
	}
	for k, kindName := range pickNames {
		nums, ok := strings.CutPrefix(rest, kindName+"-")
		if !ok {
			continue
		}
		w, sticky, hasSticky := strings.Cut(nums, "-sticky-")
		spec := pickSpec{kind: pickKind(k), weight: parseUint32(w)}
		if hasSticky {
			spec.affinity = parseUint32(sticky)
		}
		if spec.weight > 0 && spec.chain() == name {
			return spec, true
		}
	}
	return pickSpec{}, false
}

// parseUint32 parses a decimal number; 0 when it is not one.
func parseUint32(s string) uint32 {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0
	}
	return uint32(n)
}

// keyExprs loads the chain's lookup key at regKey and returns the map that
// turns it into a target id.
func (p pickSpec) keyExprs(f *family) ([]expr.Any, string, string) {
	switch p.kind {
	case pickNodePort, pickNodePortLocal:
		return portKeyExprs(), setNPTargets, "meta l4proto . th dport"
	case pickShortNP:
		return portKeyExprs(), setShortNPTargets, "meta l4proto . th dport"
	case pickShortIP:
		return f.ipKeyExprs(), setShortIPTargets, "ip daddr . meta l4proto . th dport"
	}
	return f.ipKeyExprs(), setIPTargets, "ip daddr . meta l4proto . th dport"
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
			exprs: append(l.fam.addrInLoopback(l.fam.loadSaddr(regScratch), true), setMarkBit(masqueradeMark, false)...),
		}})
	}
	if spec.affinity > 0 {
		t.add(op{kind: opAddRule, chain: c, rule: stickyHitRule(l.fam, spec)})
		t.add(op{kind: opAddRule, chain: c, rule: stickyNewRule(l.fam, spec)})
		return
	}
	key, targets, keyText := spec.keyExprs(l.fam)
	w := spec.weight
	t.add(op{kind: opAddRule, chain: c, rule: &rule{
		text:  fmt.Sprintf("dnat to %s map @%s . numgen random mod %d map @%s", keyText, targets, w, endpointsMap(w)),
		exprs: append(append(key, mapTo(regKey, targets, l.fam.regTarget())), l.fam.pickAndDNAT(w, endpointsMap(w))...),
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

// stickyHitRule sends a client with a live affinity entry to the bucket it
// had, refreshing the entry's timeout. Registers: the key from regKey, the
// target at regTarget with the client address after it (the affinity key),
// the entry's "target . bucket" back at regKey, the endpoint at regEP.
func stickyHitRule(f *family, spec pickSpec) *rule {
	key, targets, keyText := spec.keyExprs(f)
	w := spec.weight
	exprs := append(key,
		mapTo(regKey, targets, f.regTarget()),
		f.loadSaddr(f.regTarget()+1),
		mapTo(f.regTarget(), setAffinity, regKey),
		mapTo(regKey, endpointsMap(w), f.regEP()),
		updateAffinity(f.regTarget(), regKey, spec.affinity),
		f.dnat(f.regEP()))
	return &rule{
		text: fmt.Sprintf("%s map @%s . ip saddr map @%s update @%s timeout %ds, dnat to that bucket of @%s",
			keyText, targets, setAffinity, setAffinity, spec.affinity, endpointsMap(w)),
		exprs: exprs,
	}
}

// stickyNewRule draws a bucket for a client without an entry and records it.
// Registers: "target . bucket" at regTarget, the endpoint at regEP, then
// the target again at regKey (over the key, no longer needed) with the
// client address after it.
func stickyNewRule(f *family, spec pickSpec) *rule {
	key, targets, keyText := spec.keyExprs(f)
	w := spec.weight
	exprs := append(key,
		mapTo(regKey, targets, f.regTarget()),
		&expr.Numgen{Register: f.regBucket(), Modulus: w, Type: unix.NFT_NG_RANDOM},
		mapTo(f.regTarget(), endpointsMap(w), f.regEP()),
		mapTo(regKey, targets, regKey),
		f.loadSaddr(regKey+1),
		updateAffinity(regKey, f.regTarget(), spec.affinity),
		f.dnat(f.regEP()))
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
