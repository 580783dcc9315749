package iptables

import (
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// renderPartial renders the changed keys (absent from p = deleted) against
// prev: only the chains whose rules changed are declared (flushed) and
// written, chains no longer used are flushed and deleted, and rules in the
// fixed chains are deleted (-D) or added (-I at the head of nat
// KUBE-SERVICES, which must end with the node-port jumps; -A elsewhere)
// one by one. prev is not changed. A change of the node's podCIDRs under
// DetectNodeCIDR, which every service's rules use, renders in full; so
// does crossing largeClusterEndpoints, which changes every chain's comments.
// A change of the node's IP renders the services with source ranges too.
func renderPartial(f ipFamily, p *plan.Plan, changed []plan.Key, prev *written, o *Options) (restore, *written) {
	if prev == nil || prev.family != f {
		return renderFull(f, p, o, chainsOf(prev))
	}
	r := newRenderer(f, o, p.Node)
	if !slices.Equal(r.det.nodeCIDRs, prev.podCIDRs) {
		return renderFull(f, p, o, chainsOf(prev))
	}
	w := prev.next()
	keys := changed
	if r.nodeIP != prev.nodeIP {
		keys = append(slices.Clone(changed), prev.rangedKeys()...)
		w.nodeIP = r.nodeIP
	}
	keys = uniqueKeys(keys)
	for _, k := range keys {
		if old := prev.service(k); old != nil {
			w.endpoints -= old.endpoints
		}
		if s := p.Services[k]; s != nil {
			w.endpoints += len(s.Endpoints)
		}
	}
	if largeCluster(w.endpoints) != prev.quiet {
		// Every chain's comments change: rewrite everything, once.
		return renderFull(f, p, o, chainsOf(prev))
	}
	r.quiet = prev.quiet
	var e edits
	if trailer := r.nodePortJumps(p.Node); !slices.Equal(trailer, prev.trailer) {
		for _, s := range prev.trailer {
			e.nat.del = appendRule(e.nat.del, "-D", kubeServices, s)
		}
		for _, s := range trailer {
			e.nat.add = appendRule(e.nat.add, "-A", kubeServices, s)
		}
		w.trailer = trailer
	}
	for _, k := range keys {
		old := prev.service(k)
		cur := r.render(p.Services[k])
		e.chains(old, cur, &r.out)
		e.rules(old, cur)
		w.set(k, cur)
	}
	w.settle()
	return restore{Filter: e.filter.text("filter"), NAT: e.nat.text("nat")}, w
}

// uniqueKeys returns the keys sorted, without duplicates.
func uniqueKeys(keys []plan.Key) []plan.Key {
	out := slices.Clone(keys)
	slices.SortFunc(out, plan.Key.Compare)
	return slices.Compact(out)
}

// tableEdits collects the sections of one table's partial restore text.
type tableEdits struct {
	decl, del, add, chains, remove []byte
}

// text returns the restore text, or nil when there is nothing to change.
func (t *tableEdits) text(table string) []byte {
	n := len(t.decl) + len(t.del) + len(t.add) + len(t.chains) + len(t.remove)
	if n == 0 {
		return nil
	}
	b := make([]byte, 0, n+len(table)+10)
	b = append(append(append(b, '*'), table...), '\n')
	for _, s := range [][]byte{t.decl, t.del, t.add, t.chains, t.remove} {
		b = append(b, s...)
	}
	return append(b, "COMMIT\n"...)
}

// edits is a partial render's text for both tables.
type edits struct {
	nat, filter tableEdits
}

// chains writes the service's chains whose rules changed and deletes those
// it no longer has. cur is nil for a service gone from the family; out is
// then ignored.
func (e *edits) chains(old, cur *svcWritten, out *serviceText) {
	var oldSums, curNames map[string]uint64
	if cur != nil {
		oldSums = chainIndex(old)
		for i, c := range out.chains {
			if sum, ok := oldSums[c.name]; ok && sum == cur.chains[i].sum {
				continue
			}
			e.nat.decl = declare(e.nat.decl, c.name)
			e.nat.chains = append(e.nat.chains, out.text[c.start:c.end]...)
		}
		curNames = chainIndex(cur)
	}
	if old == nil {
		return
	}
	for _, c := range old.chains {
		if _, ok := curNames[c.name]; !ok {
			e.nat.decl = declare(e.nat.decl, c.name)
			e.nat.remove = deleteChains(e.nat.remove, []string{c.name})
		}
	}
}

// chainIndex maps the chains of s to their sums; nil for a nil s.
func chainIndex(s *svcWritten) map[string]uint64 {
	if s == nil {
		return nil
	}
	m := make(map[string]uint64, len(s.chains))
	for _, c := range s.chains {
		m[c.name] = c.sum
	}
	return m
}

// rules deletes the service's rules in fixed chains that it no longer has
// and adds its new ones.
func (e *edits) rules(old, cur *svcWritten) {
	var oldRules, curRules []sharedRule
	if old != nil {
		oldRules = old.rules
	}
	if cur != nil {
		curRules = cur.rules
	}
	for _, sr := range oldRules {
		if !slices.Contains(curRules, sr) {
			t := e.table(sr.table)
			t.del = appendRule(t.del, "-D", sr.chain, sr.spec)
		}
	}
	for _, sr := range curRules {
		if !slices.Contains(oldRules, sr) {
			t, op := e.table(sr.table), "-A"
			if sr.insert {
				op = "-I"
			}
			t.add = appendRule(t.add, op, sr.chain, sr.spec)
		}
	}
}

// table returns the edits of table t.
func (e *edits) table(t tableID) *tableEdits {
	if t == natTable {
		return &e.nat
	}
	return &e.filter
}
