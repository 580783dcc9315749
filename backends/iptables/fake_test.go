package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// fakeKernel is an in-memory model of the nat and filter tables of one
// family that applies restore texts the way iptables-restore --noflush
// does, as strictly as the kernel: a rule must jump to an existing chain,
// -D must find its rule, -X needs an empty chain nothing jumps to, and a
// failing text changes nothing.
type fakeKernel map[string]map[string][]string // table → chain → rule specs

// apply runs one restore text; on error the tables are unchanged.
func (k fakeKernel) apply(text []byte) error {
	if text == nil {
		return nil
	}
	var table string
	var work map[string][]string
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if err := fakeLine(line, &table, &work, k); err != nil {
			return fmt.Errorf("line %d %q: %w", n, line, err)
		}
	}
	if work != nil {
		return fmt.Errorf("no COMMIT")
	}
	return nil
}

// fakeLine applies one line to the working copy of the table, committing
// it to k at COMMIT.
func fakeLine(line string, table *string, work *map[string][]string, k fakeKernel) error {
	switch {
	case strings.HasPrefix(line, "*"):
		*table = line[1:]
		*work = map[string][]string{}
		for c, rules := range k[*table] {
			(*work)[c] = slices.Clone(rules)
		}
	case line == "COMMIT":
		k[*table] = *work
		*work = nil
	case strings.HasPrefix(line, ":"):
		name, _, _ := strings.Cut(line[1:], " ")
		(*work)[name] = nil
	default:
		op, rest, _ := strings.Cut(line, " ")
		chain, spec, _ := strings.Cut(rest, " ")
		return fakeOp(*work, op, chain, spec)
	}
	return nil
}

// fakeOp applies -A, -I, -D or -X.
func fakeOp(t map[string][]string, op, chain, spec string) error {
	rules, ok := t[chain]
	if !ok {
		return fmt.Errorf("no chain %s", chain)
	}
	if target := fakeTarget(spec); strings.HasPrefix(target, "KUBE-") {
		if _, ok := t[target]; !ok {
			return fmt.Errorf("no target chain %s", target)
		}
	}
	switch op {
	case "-A":
		t[chain] = append(rules, spec)
	case "-I":
		t[chain] = append([]string{spec}, rules...)
	case "-D":
		i := slices.Index(rules, spec)
		if i < 0 {
			return fmt.Errorf("no such rule in %s", chain)
		}
		t[chain] = slices.Delete(slices.Clone(rules), i, i+1)
	case "-X":
		if len(rules) > 0 {
			return fmt.Errorf("chain %s not empty", chain)
		}
		for c, rs := range t {
			for _, r := range rs {
				if fakeTarget(r) == chain {
					return fmt.Errorf("chain %s still referenced from %s", chain, c)
				}
			}
		}
		delete(t, chain)
	default:
		return fmt.Errorf("unknown operation %s", op)
	}
	return nil
}

// fakeTarget returns the -j target of a rule spec.
func fakeTarget(spec string) string {
	_, after, ok := strings.Cut(spec, "-j ")
	if !ok {
		return ""
	}
	target, _, _ := strings.Cut(after, " ")
	return target
}

// applyRestore applies both tables of r, filter first like the backend.
func (k fakeKernel) applyRestore(t *testing.T, r restore) {
	t.Helper()
	if err := k.apply(r.Filter); err != nil {
		t.Fatalf("filter restore fails: %v\n%s", err, r.Filter)
	}
	if err := k.apply(r.NAT); err != nil {
		t.Fatalf("nat restore fails: %v\n%s", err, r.NAT)
	}
}

// fixedOrderFree are the fixed chains whose rules may be in any order
// between services (partial syncs insert or append them).
var fixedOrderFree = map[string]bool{
	kubeServices: true, kubeNodePorts: true, kubeExternalServices: true, kubeProxyFirewall: true,
}

// sameAs reports how k differs from want: service chains must match
// exactly, fixed chains as sets of rules, except that nat KUBE-SERVICES
// must end with the same node-port jumps, and each firewall exception must
// precede its drop.
func (k fakeKernel) sameAs(want fakeKernel, trailer []string) []string {
	var diffs []string
	for _, table := range []string{"filter", "nat"} {
		got, exp := k[table], want[table]
		for _, c := range slices.Sorted(maps.Keys(exp)) {
			g, e := got[c], exp[c]
			if _, ok := got[c]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: chain %s missing", table, c))
				continue
			}
			if fixedOrderFree[c] {
				if table == "nat" && c == kubeServices && !slices.Equal(g[max(0, len(g)-len(trailer)):], trailer) {
					diffs = append(diffs, fmt.Sprintf("nat: %s does not end with the node-port jumps: %q", c, g))
				}
				if c == kubeProxyFirewall && !firewallOrdered(g) {
					diffs = append(diffs, fmt.Sprintf("filter: %s has a drop before its exceptions: %q", c, g))
				}
				g, e = slices.Sorted(slices.Values(g)), slices.Sorted(slices.Values(e))
			}
			if !slices.Equal(g, e) {
				diffs = append(diffs, fmt.Sprintf("%s: chain %s is\n  %q\nwant\n  %q", table, c, g, e))
			}
		}
		for c := range got {
			if _, ok := exp[c]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: extra chain %s: %q", table, c, got[c]))
			}
		}
	}
	return diffs
}

// firewallOrdered says whether every RETURN rule comes before the DROP
// rule for the same destination.
func firewallOrdered(rules []string) bool {
	dropped := map[string]bool{}
	for _, r := range rules {
		dest := r[strings.Index(r, " -d "):strings.LastIndex(r, " -j ")]
		switch {
		case strings.HasSuffix(r, "-j DROP"):
			dropped[dest] = true
		case strings.HasSuffix(r, "-j RETURN") && dropped[dest]:
			return false
		}
	}
	return true
}
