package iptables

import (
	"bytes"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

var _ backends.Reporter = (*Backend)(nil)

// figures counts what the Sync under way did in one family's tables, for
// Report. Each family has its own, as a full sync may write both families
// at once.
type figures struct {
	// failed counts the restores the kernel refused, partial those of them
	// that wrote a partial render.
	failed, partial int
	// written counts, per table, the rules of the restores it accepted.
	written map[string]int
}

// refused counts a failed restore of a render that was full or not.
func (c *figures) refused(full bool) {
	c.failed++
	if !full {
		c.partial++
	}
}

// accepted counts the rules a restore of table wrote.
func (c *figures) accepted(table string, text []byte) {
	if c.written == nil {
		c.written = map[string]int{}
	}
	c.written[table] += rulesIn(text)
}

// rulesIn counts the rules a restore text appends or inserts, as
// kube-proxy counts the rules it writes: neither chain declarations and
// deletions nor the rules it deletes.
func rulesIn(text []byte) int {
	n := 0
	for line := range bytes.Lines(text) {
		if bytes.HasPrefix(line, []byte("-A ")) || bytes.HasPrefix(line, []byte("-I ")) {
			n++
		}
	}
	return n
}

// Report returns the figures of the latest Sync; see backends.Reporter.
// Failed counts every iptables-restore run of the rules that failed, also
// those Sync then made up for by rewriting everything; FailedPartial those
// of them that wrote only the changed services. After a Sync that
// succeeded, Tables counts the rules in Weir's chains of each table (not
// the jumps from the built-in chains), like kube-proxy's
// sync_proxy_rules_iptables_total, and the rules the Sync's restores wrote.
func (b *Backend) Report() backends.Report {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.report
}

// startReport forgets the figures of the previous Sync; b.mu is held.
func (b *Backend) startReport() {
	for _, fam := range b.fams {
		fam.counted = figures{}
	}
}

// finishReport keeps the figures of the Sync that just ended, with the
// rule counts when it succeeded; b.mu is held.
func (b *Backend) finishReport(p *plan.Plan, ok bool) {
	r := backends.Report{Families: make([]backends.FamilyReport, 0, len(b.fams))}
	for _, fam := range b.fams {
		fr := backends.FamilyReport{Family: familyName(fam.f), Failed: fam.counted.failed, FailedPartial: fam.counted.partial}
		switch {
		case ok && fam.last != nil:
			nat, filter := b.ownedRules(fam, p.Node)
			fr.Tables = map[string]backends.Rules{
				tableNAT:    {Total: nat, Written: fam.counted.written[tableNAT]},
				tableFilter: {Total: filter, Written: fam.counted.written[tableFilter]},
			}
		case fam.owned.of != fam.last:
			fam.owned = owned{} // keeps no replaced written alive
		}
		r.Families = append(r.Families, fr)
	}
	b.report = r
}

// ownedRules counts the rules of Weir's chains in one family's nat and
// filter tables from what the backend remembers writing: the fixed rules,
// and those of the services and the node-port jumps, which fam.owned keeps.
func (b *Backend) ownedRules(fam *family, node plan.Node) (nat, filter int) {
	if fam.owned.of != fam.last {
		fam.owned = countOwned(fam.last)
	}
	r := newRenderer(fam.f, &b.opts, node)
	return rulesIn(r.staticNAT(nil)) + fam.owned.nat, rulesIn(r.staticFilter(nil)) + fam.owned.filter
}

// owned counts the rules of what a written records besides the fixed
// rules: the services' chains and rules in the fixed chains, and the
// node-port jumps ending nat KUBE-SERVICES.
type owned struct {
	of          *written
	nat, filter int
}

// countOwned counts w's rules, walking every service: after a rewrite,
// which is as long.
func countOwned(w *written) owned {
	o := owned{of: w, nat: len(w.trailer)}
	w.each(func(_ plan.Key, s *svcWritten) {
		nat, filter := serviceRules(s)
		o.nat, o.filter = o.nat+nat, o.filter+filter
	})
	return o
}

// followPartial carries fam.owned over a partial render of changed from
// fam.last to w, in proportion to the change; a full render (r.Full) is
// counted whole at the next Report.
func (fam *family) followPartial(w *written, changed []plan.Key, full bool) {
	o := &fam.owned
	if full || o.of == nil || o.of != fam.last {
		*o = owned{}
		return
	}
	for _, k := range uniqueKeys(changed) {
		nat, filter := serviceRules(w.service(k))
		oldNAT, oldFilter := serviceRules(fam.last.service(k))
		o.nat, o.filter = o.nat+nat-oldNAT, o.filter+filter-oldFilter
	}
	o.nat += len(w.trailer) - len(fam.last.trailer)
	o.of = w
}

// serviceRules counts the rules one service wrote in each table; none for
// nil.
func serviceRules(s *svcWritten) (nat, filter int) {
	if s == nil {
		return 0, 0
	}
	for _, c := range s.chains {
		nat += int(c.rules)
	}
	for _, sr := range s.rules {
		if sr.table == natTable {
			nat++
		} else {
			filter++
		}
	}
	return nat, filter
}

// familyName is the Report's name of f.
func familyName(f ipFamily) string {
	if f == ipv6 {
		return backends.IPv6
	}
	return backends.IPv4
}
