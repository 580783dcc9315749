package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/weirproxy/weir/sdk/plan"
)

// The periodic full sync's look at the kernel. Between two rewrites, the
// full sync that runs every syncPeriod must notice when someone removed or
// changed Weir's rules by hand (iptables -F, a chain deleted, nft flush
// ruleset), without iptables-save, which takes minutes at 10k services
// with iptables-nft. It reads which chains each table has, a count per
// chain, and the jump rules from the built-in chains, and compares them
// with what the backend remembers writing (drift):
//
//   - iptables-legacy: the table's blob, read with the getsockopt the
//     tools use; the count is the chain's number of rules.
//   - iptables-nft: one netlink dump of the family's chains, whose count is
//     the kernel's use of each chain (its rules plus the jumps to it), and
//     a dump of each built-in chain's rules. (A dump of every rule would
//     tell rule counts directly, but the kernel resumes a large dump by
//     skipping from the start: 4.5 s for 68k rules.)
//
// What it cannot see: a rule replaced by another with the same effect on
// the counts, or changed in place; the hourly rewrite repairs those.

// tableLook is what a look at one table of the kernel found.
type tableLook struct {
	// counts maps every chain of the table, built-in or not, to its count:
	// with iptables-legacy its number of rules (a built-in chain's policy
	// is not one), with iptables-nft its use (withRefs).
	counts map[string]int
	// withRefs says that counts also count the jumps to each chain.
	withRefs bool
	// baseRefs counts, with withRefs, the jumps to each chain from the
	// built-in chains, whoever wrote them.
	baseRefs map[string]int
	// jumps are the rules of built-in chains that jump to a chain with a
	// comment, keyed like the jumps table; newOnly is set for a rule that
	// matches connection states.
	jumps map[jump]bool
}

// newTableLook returns an empty look.
func newTableLook(withRefs bool) *tableLook {
	return &tableLook{counts: map[string]int{}, withRefs: withRefs, baseRefs: map[string]int{}, jumps: map[jump]bool{}}
}

// lookFamily reads the nat and filter tables of family f, keyed by table.
func (b *Backend) lookFamily(ctx context.Context, f ipFamily) (map[string]*tableLook, error) {
	return b.lookTables(ctx, f, []string{tableFilter, tableNAT})
}

// lookTables reads the tables of family f, keyed by table.
func (b *Backend) lookTables(ctx context.Context, f ipFamily, tables []string) (map[string]*tableLook, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.fl.name == flavourNFT {
		out, err := lookNFT(b.opts.NetNS, f, tables)
		if err != nil {
			return nil, fmt.Errorf("iptables: look at IPv%d tables: %w", f, err)
		}
		return out, nil
	}
	out := map[string]*tableLook{}
	for _, table := range tables {
		l, err := lookLegacy(b.opts.NetNS, f, table)
		if err != nil {
			return nil, fmt.Errorf("iptables: look at IPv%d table %s: %w", f, table, err)
		}
		out[table] = l
	}
	return out, nil
}

// missingJumps returns the jump rules look does not have.
func missingJumps(look map[string]*tableLook) []jump {
	var out []jump
	for _, j := range jumps {
		if l := look[j.table]; l == nil || !l.jumps[j] {
			out = append(out, j)
		}
	}
	return out
}

// ownedIn returns, per table, the chains of look with Weir's names.
func ownedIn(look map[string]*tableLook) map[string][]string {
	out := map[string][]string{}
	for table, l := range look {
		for chain := range l.counts {
			if ownedChain(chain) {
				out[table] = append(out[table], chain)
			}
		}
	}
	return out
}

// drift describes how look differs from what w says Weir wrote: each
// chain of Weir's that is missing or has another count, and each missing
// jump rule, in plain words (at most limit of them; n counts all). Chains
// with Weir's names that w does not know are not drift, as no rule of
// Weir's uses them: they are returned per table, for the next rewrite to
// delete. look is consumed.
func drift(w *written, r *renderer, look map[string]*tableLook, limit int) (diffs []string, n int, unknown map[string][]string) {
	add := func(format string, args ...any) {
		if n++; n <= limit {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	for _, j := range missingJumps(look) {
		add("%s chain %s has no jump to %s", j.table, j.from, j.to)
	}
	check := func(table, chain string, rules, refs int, owner string) {
		l := look[table]
		got, ok := l.counts[chain]
		delete(l.counts, chain)
		want, what := rules, "rules"
		if l.withRefs {
			want, what = rules+refs+l.baseRefs[chain], "rules and jumps to it"
		}
		switch {
		case !ok:
			add("%s chain %s%s is missing", table, chain, owner)
		case got != want:
			add("%s chain %s%s has %d %s, Weir wrote %d", table, chain, owner, got, what, want)
		}
	}
	for table, counts := range fixedCounts(w, r) {
		for _, chain := range slices.Sorted(maps.Keys(counts)) {
			check(table, chain, counts[chain][0], counts[chain][1], "")
		}
	}
	w.each(func(k plan.Key, s *svcWritten) {
		for _, c := range s.chains {
			check(tableNAT, c.name, int(c.rules), int(c.refs), " (of "+k.String()+")")
		}
	})
	return diffs, n, ownedIn(look)
}

// fixedCounts returns, per table, the number of rules w says each of
// Weir's fixed chains holds (the renderer's static rules, the services'
// rules in them and the node-port jumps ending nat KUBE-SERVICES) and the
// number of Weir's rules outside the built-in chains that jump to it.
func fixedCounts(w *written, r *renderer) map[string]map[string][2]int {
	nat, filter := map[string][2]int{}, map[string][2]int{}
	for _, c := range natChains {
		nat[c] = [2]int{}
	}
	for _, c := range filterChains {
		filter[c] = [2]int{}
	}
	countRules(nat, r.staticNAT(nil))
	countRules(filter, r.staticFilter(nil))
	bump := func(m map[string][2]int, chain string, i, by int) {
		c := m[chain]
		c[i] += by
		m[chain] = c
	}
	for _, s := range w.trailer {
		bump(nat, kubeServices, 0, 1)
		if string(jumpTarget([]byte(s))) == kubeNodePorts {
			bump(nat, kubeNodePorts, 1, 1)
		}
	}
	w.each(func(_ plan.Key, s *svcWritten) {
		bump(nat, kubeMarkMasq, 1, int(s.masqRefs))
		for _, sr := range s.rules {
			if sr.table == natTable {
				bump(nat, sr.chain, 0, 1)
			} else {
				bump(filter, sr.chain, 0, 1)
			}
		}
	})
	return map[string]map[string][2]int{tableNAT: nat, tableFilter: filter}
}

// countRules adds the "-A CHAIN" lines of text to the rule counts.
func countRules(counts map[string][2]int, text []byte) {
	for line := range strings.Lines(string(text)) {
		if rest, ok := strings.CutPrefix(line, "-A "); ok {
			chain, _, _ := strings.Cut(rest, " ")
			c := counts[chain]
			c[0]++
			counts[chain] = c
		}
	}
}
