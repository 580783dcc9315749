package nftables

import (
	"fmt"
	"strconv"
	"strings"
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

// pickSpec identifies one shared pick chain: every entry without ClientIP
// affinity whose pool has the same kind and total weight goes through the
// same chain.
type pickSpec struct {
	kind   pickKind
	weight uint32
}

func (p pickSpec) chain() string { return fmt.Sprintf("pick-%s-%d", pickNames[p.kind], p.weight) }

// parsePickChain returns the spec a pick chain's name stands for; false
// when the name is not one Weir gives a pick chain.
func parsePickChain(name string) (pickSpec, bool) {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return pickSpec{}, false
	}
	for k, kindName := range pickNames {
		if w, ok := strings.CutPrefix(rest, kindName+"-"); ok {
			spec := pickSpec{kind: pickKind(k), weight: parseUint32(w)}
			if spec.weight > 0 && spec.chain() == name {
				return spec, true
			}
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

// lane is the verdict map a kind's entries are in: it decides the shape of
// their keys and the endpoints maps their pick chains draw from.
type lane uint8

const (
	laneIP lane = iota
	laneNodePort
	laneShortIP
	laneShortNodePort
)

var laneMaps = [...]string{"endpoints-", "nodeport-endpoints-", "local-origin-endpoints-", "local-origin-nodeport-endpoints-"}

func (k pickKind) lane() lane {
	switch k {
	case pickNodePort, pickNodePortLocal:
		return laneNodePort
	case pickShortIP:
		return laneShortIP
	case pickShortNP:
		return laneShortNodePort
	}
	return laneIP
}

// mapID names one endpoints map: the buckets of every pool of total weight
// W drawn through the verdict map of one lane.
type mapID struct {
	lane   lane
	weight uint32
}

func (m mapID) name() string { return fmt.Sprintf("%s%d", laneMaps[m.lane], m.weight) }

// parseEndpointsMap returns the map a name stands for; false when it is not
// the name of an endpoints map.
func parseEndpointsMap(name string) (mapID, bool) {
	// The longest prefix first: "endpoints-" ends the others.
	for l := len(laneMaps) - 1; l >= 0; l-- {
		if w, ok := strings.CutPrefix(name, laneMaps[l]); ok {
			m := mapID{lane: lane(l), weight: parseUint32(w)}
			return m, m.weight > 0 && m.name() == name
		}
	}
	return mapID{}, false
}

// vmap returns the verdict map holding the lane's entries.
func (l lane) vmap() string { return laneVmaps[l] }

var laneVmaps = [...]string{setServiceIPs, setNodePorts, setShortIPs, setShortNodePorts}

// portKeyed reports whether the lane's keys are "protocol . port".
func (l lane) portKeyed() bool { return l == laneNodePort || l == laneShortNodePort }

// keyFields returns the fields of the lane's lookup key.
func (l lane) keyFields(f *family) []field {
	if l.portKeyed() {
		return []field{l4protoField(), dportField()}
	}
	return f.serviceFields()
}

// addPickChain appends the chain for spec with its rules.
func (l *layout) addPickChain(t *txn, spec pickSpec) {
	c := l.chain(spec.chain())
	t.add(op{kind: opAddChain, chain: c})
	for _, r := range l.kindRules(spec.kind) {
		t.add(op{kind: opAddRule, chain: c, rule: r})
	}
	t.add(op{kind: opAddRule, chain: c, rule: l.pickRule(spec)})
}

// kindRules returns the rules a kind's chains start with: they mark what
// must be masqueraded.
func (l *layout) kindRules(kind pickKind) []*rule {
	var out []*rule
	if kind == pickShortIP || kind == pickShortNP {
		out = append(out, shortCircuitMasquerade())
	}
	if r := l.masqueradeRule(kind); r != nil {
		out = append(out, r)
	}
	if kind == pickNodePortLocal && l.opts.LocalhostNodePorts {
		// A reply cannot go back to 127.0.0.1 from a pod: masquerade localhost.
		out = append(out, ruleOf(l.fam.inLoopback(l.fam.saddrField(), true), markMasquerade()))
	}
	return out
}

// pickRule draws a bucket of the packet's entry at random and rewrites the
// destination to that bucket's endpoint: the key with the bucket after it
// is the endpoints map's key.
func (l *layout) pickRule(spec pickSpec) *rule {
	lane := spec.kind.lane()
	k := keyOf(append(lane.keyFields(l.fam), numgenField(spec.weight))...)
	return ruleOf(k.dnatVia(l.fam, mapID{lane: lane, weight: spec.weight}.name()))
}

// masqueradeRule returns the rule marking a kind's packets for masquerading,
// or nil when they keep their source.
func (l *layout) masqueradeRule(kind pickKind) *rule {
	switch kind {
	case pickCluster, pickShortIP, pickShortNP:
		return l.clusterMasqueradeRule()
	case pickExternal, pickNodePort:
		return ruleOf(markMasquerade())
	}
	return nil
}
