package ipvs

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// masqLayer is the state of the masquerade layer: the ipsets describing
// the service destinations and the fixed nat rules matching them.
type masqLayer struct {
	log     *slog.Logger
	flavour string
	sets    ipsetConn
	tools   []ruleTools
	ipts    []*goipt.IPTables
	// refs counts the services needing each set entry; it is what the
	// sets hold.
	refs map[setEntry]int
	// podCIDRs are the node's pod CIDRs the rules were written with.
	podCIDRs []netip.Prefix
	// marks are the short-circuit rules of every service; marksChanged is
	// true when they differ from those in the kernel's mangle table.
	marks        map[markRule]int
	marksChanged bool
}

// newMasqLayer resolves the iptables flavour and its binaries.
func newMasqLayer(ctx context.Context, netNS int, sets ipsetConn, flavour string, log *slog.Logger) (*masqLayer, error) {
	fl, err := chooseFlavour(ctx, netNS, flavour)
	if err != nil {
		return nil, err
	}
	tools, ipts, err := flavourIPTables(fl)
	if err != nil {
		return nil, err
	}
	return &masqLayer{log: log, flavour: fl, sets: sets, tools: tools, ipts: ipts, refs: map[setEntry]int{}, marks: map[markRule]int{}}, nil
}

// flavourIPTables returns the binaries of flavour fl and go-iptables for
// each family.
func flavourIPTables(fl string) ([]ruleTools, []*goipt.IPTables, error) {
	tools, err := flavourTools(fl)
	if err != nil {
		return nil, nil, err
	}
	var ipts []*goipt.IPTables
	for _, t := range tools {
		ipt, err := newIPTables(t)
		if err != nil {
			return nil, nil, err
		}
		ipts = append(ipts, ipt)
	}
	return tools, ipts, nil
}

// rulesStale reports whether the rules depend on the node's pod CIDRs
// and those changed: a full sync rewrites them.
func (m *masqLayer) rulesStale(o *backends.Common, node plan.Node) bool {
	return o.Detector() == backends.DetectNodeCIDR && !slices.Equal(node.PodCIDRs, m.podCIDRs)
}

// syncFull makes the sets hold the entries of services, reading them
// back (creating missing sets and replacing those of the wrong kind), and
// rewrites the rules of both families.
func (m *masqLayer) syncFull(ctx context.Context, o *backends.Common, node plan.Node, services map[plan.Key]*serviceState) error {
	m.refs, m.marks, m.marksChanged = map[setEntry]int{}, map[markRule]int{}, false
	for _, st := range services {
		for _, e := range st.entries {
			m.refs[e]++
		}
		for _, r := range st.marks {
			m.marks[r]++
		}
	}
	if err := ensureSets(m.sets); err != nil {
		return err
	}
	lists, wrong, listErr := listSets(m.sets)
	if len(wrong) > 0 {
		if err := m.replaceSets(ctx, o, lists, wrong); err != nil {
			return err
		}
	}
	errs := []error{listErr, reconcileSets(m.sets, lists, m.refs)}
	m.podCIDRs = slices.Clone(node.PodCIDRs)
	for i, t := range m.tools {
		err := restore(ctx, o.NetNS, t, renderRules(t.family, o, node, m.markRules()))
		if err == nil {
			err = ensureJumps(o.NetNS, m.ipts[i], t.iptables)
		}
		errs = append(errs, err)
	}
	return firstOf(errs)
}

// replaceSets creates the sets wrong anew (see listSets): it flushes the
// layer's chains in both families, which the rules written next restore,
// so that no rule uses them, and notes them as listed empty in lists.
func (m *masqLayer) replaceSets(ctx context.Context, o *backends.Common, lists map[string]*netlink.IPSetResult, wrong []setSpec) error {
	for _, s := range wrong {
		m.log.Warn("An ipset under Weir's name is not what Weir creates; replacing it (masquerading and source-range checks pause until the rules are rewritten, in this sync)",
			"ipset", s.name, "problem", s.mismatch(lists[s.name]))
	}
	for _, t := range m.tools {
		if err := restore(ctx, o.NetNS, t, renderEmpty()); err != nil {
			return err
		}
	}
	if err := replaceSets(m.sets, wrong); err != nil {
		return err
	}
	for _, s := range wrong {
		lists[s.name] = &netlink.IPSetResult{SetName: s.name}
	}
	return nil
}

// syncService moves one service's entries from old to new, and notes
// whether its short-circuit rules changed.
func (m *masqLayer) syncService(old, new *serviceState) error {
	var before, after []markRule
	if old != nil {
		before = old.marks
	}
	if new != nil {
		after = new.marks
	}
	if !slices.Equal(before, after) {
		for _, r := range before {
			if m.marks[r]--; m.marks[r] <= 0 {
				delete(m.marks, r)
			}
		}
		for _, r := range after {
			m.marks[r]++
		}
		m.marksChanged = true
	}
	return updateSets(m.sets, m.refs, entriesOf(old), entriesOf(new))
}

// writeMarks rewrites the mangle table's short-circuit rules of both
// families when services changed them since they were last written.
func (m *masqLayer) writeMarks(ctx context.Context, o *backends.Common, node plan.Node) error {
	if !m.marksChanged {
		return nil
	}
	rules := m.markRules()
	var errs []error
	for _, t := range m.tools {
		errs = append(errs, restore(ctx, o.NetNS, t, []byte(renderMangle(t.family, o, node, rules))))
	}
	err := firstOf(errs)
	m.marksChanged = err != nil
	return err
}

// markRules returns the short-circuit rules in a stable order.
func (m *masqLayer) markRules() []markRule {
	return slices.SortedFunc(maps.Keys(m.marks), markRule.compare)
}

// cleanup removes the rules, in both flavours (the sets cannot go while
// rules of either use them; the other's binaries may be missing), then
// the sets. It returns the chains it deleted, as "iptables-legacy nat
// WEIR-IPVS-SERVICES", and the sets it destroyed.
func (m *masqLayer) cleanup(netNS int) (chains, sets []string, err error) {
	var errs []error
	tools, ipts := m.tools, m.ipts
	other := map[string]string{FlavourNFT: FlavourLegacy, FlavourLegacy: FlavourNFT}[m.flavour]
	if moreTools, more, err := flavourIPTables(other); err == nil {
		tools, ipts = slices.Concat(tools, moreTools), slices.Concat(ipts, more)
	}
	for i, ipt := range ipts {
		removed, err := removeRules(netNS, ipt)
		for _, c := range removed {
			chains = append(chains, filepath.Base(tools[i].iptables)+" "+c)
		}
		errs = append(errs, err)
	}
	sets, err = destroySets(m.sets)
	m.refs, m.podCIDRs, m.marks, m.marksChanged = map[setEntry]int{}, nil, map[markRule]int{}, false
	return chains, sets, firstOf(append(errs, err))
}

func entriesOf(st *serviceState) []setEntry {
	if st == nil {
		return nil
	}
	return st.entries
}
