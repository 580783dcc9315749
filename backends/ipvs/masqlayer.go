package ipvs

import (
	"context"
	"net/netip"
	"slices"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// masqLayer is the state of the masquerade layer: the ipsets describing
// the service destinations and the fixed nat rules matching them.
type masqLayer struct {
	sets  ipsetConn
	tools []ruleTools
	ipts  []*goipt.IPTables
	// refs counts the services needing each set entry; it is what the
	// sets hold.
	refs map[setEntry]int
	// podCIDRs are the node's pod CIDRs the rules were written with.
	podCIDRs []netip.Prefix
}

// newMasqLayer resolves the iptables flavour and its binaries.
func newMasqLayer(ctx context.Context, netNS int, sets ipsetConn, flavour string) (*masqLayer, error) {
	fl, err := chooseFlavourIn(ctx, netNS, flavour)
	if err != nil {
		return nil, err
	}
	tools, err := flavourTools(fl)
	if err != nil {
		return nil, err
	}
	m := &masqLayer{sets: sets, tools: tools, refs: map[setEntry]int{}}
	for _, t := range tools {
		ipt, err := newIPTables(t)
		if err != nil {
			return nil, err
		}
		m.ipts = append(m.ipts, ipt)
	}
	return m, nil
}

// rulesStale reports whether the rules depend on the node's pod CIDRs
// and those changed: a full sync rewrites them.
func (m *masqLayer) rulesStale(o *backends.Common, node plan.Node) bool {
	return o.Detector() == backends.DetectNodeCIDR && !slices.Equal(node.PodCIDRs, m.podCIDRs)
}

// syncFull makes the sets hold the entries of services, reading them
// back, and rewrites the rules of both families.
func (m *masqLayer) syncFull(ctx context.Context, o *backends.Common, node plan.Node, services map[plan.Key]*serviceState) error {
	m.refs = map[setEntry]int{}
	for _, st := range services {
		for _, e := range st.entries {
			m.refs[e]++
		}
	}
	if err := ensureSets(m.sets); err != nil {
		return err
	}
	errs := []error{reconcileSets(m.sets, m.refs)}
	m.podCIDRs = slices.Clone(node.PodCIDRs)
	for i, t := range m.tools {
		err := restore(ctx, o.NetNS, t, renderNAT(t.family, o, node))
		if err == nil {
			err = ensureJumps(o.NetNS, m.ipts[i])
		}
		errs = append(errs, err)
	}
	return firstOf(errs)
}

// syncService moves one service's entries from old to new.
func (m *masqLayer) syncService(old, new *serviceState) error {
	return updateSets(m.sets, m.refs, entriesOf(old), entriesOf(new))
}

// cleanup removes the rules, then the sets they use.
func (m *masqLayer) cleanup(netNS int) error {
	var errs []error
	for _, ipt := range m.ipts {
		errs = append(errs, removeRules(netNS, ipt))
	}
	errs = append(errs, destroySets(m.sets))
	m.refs, m.podCIDRs = map[setEntry]int{}, nil
	return firstOf(errs)
}

func entriesOf(st *serviceState) []setEntry {
	if st == nil {
		return nil
	}
	return st.entries
}
