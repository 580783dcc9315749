package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/backends/internal/xtables"
)

// The tables Weir writes.
const (
	tableNAT    = "nat"
	tableFilter = "filter"
)

// jump is one rule in a built-in chain that sends traffic into one of
// Weir's chains; the same rules, comments included, as kube-proxy's, so a
// node switching between the two finds them in place.
type jump struct {
	table, from, to, comment string
	// newOnly limits the jump to packets of new connections.
	newOnly bool
}

// spec returns the rule as iptables arguments.
func (j jump) spec() []string {
	var s []string
	if j.newOnly {
		s = append(s, "-m", "conntrack", "--ctstate", "NEW")
	}
	return append(s, "-m", "comment", "--comment", j.comment, "-j", j.to)
}

// The comments of the jump rules.
const (
	commentServices  = "kubernetes service portals"
	commentExternal  = "kubernetes externally-visible service portals"
	commentFirewall  = "kubernetes load balancer firewall"
	commentHealth    = "kubernetes health check service ports"
	commentForward   = "kubernetes forwarding rules"
	commentPostroute = "kubernetes postrouting rules"
)

// jumps are the rules that hook Weir's chains into the built-in ones, in
// the order they end up in each built-in chain (they go first in it).
var jumps = []jump{
	{tableFilter, "INPUT", "KUBE-PROXY-FIREWALL", commentFirewall, true},
	{tableFilter, "INPUT", "KUBE-NODEPORTS", commentHealth, false},
	{tableFilter, "INPUT", "KUBE-EXTERNAL-SERVICES", commentExternal, true},
	{tableFilter, "FORWARD", "KUBE-PROXY-FIREWALL", commentFirewall, true},
	{tableFilter, "FORWARD", "KUBE-FORWARD", commentForward, false},
	{tableFilter, "FORWARD", "KUBE-SERVICES", commentServices, true},
	{tableFilter, "FORWARD", "KUBE-EXTERNAL-SERVICES", commentExternal, true},
	{tableFilter, "OUTPUT", "KUBE-PROXY-FIREWALL", commentFirewall, true},
	{tableFilter, "OUTPUT", "KUBE-SERVICES", commentServices, true},
	{tableNAT, "PREROUTING", "KUBE-SERVICES", commentServices, false},
	{tableNAT, "OUTPUT", "KUBE-SERVICES", commentServices, false},
	{tableNAT, "POSTROUTING", "KUBE-POSTROUTING", commentPostroute, false},
}

// ownedChain says whether chain, in nat or filter, is one of Weir's:
// kube-proxy's names (the fixed chains and the per-service prefixes), so
// Weir takes kube-proxy's chains over and its cleanup removes them. Chains
// of kubelet (KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY,
// KUBE-IPTABLES-HINT) and others are left alone.
func ownedChain(chain string) bool {
	return slices.Contains(natChains, chain) || slices.Contains(filterChains, chain) || isServiceChain(chain)
}

// newIPTables returns a go-iptables handle running the flavour's iptables
// binary of family f. Its commands run in the caller's namespace: call them
// through inNetNS.
func newIPTables(fl *flavour, f ipFamily) (*goipt.IPTables, error) {
	proto := goipt.ProtocolIPv4
	if f == ipv6 {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(fl.tools(f).iptables), goipt.Timeout(int(xtables.LockWait/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("iptables: %s: %w", fl.tools(f).iptables, err)
	}
	return ipt, nil
}

// ensureJumps adds the jump rules that are missing, each at the head of its
// built-in chain, inside netNS, creating the (empty) chains they target
// when missing; intact says whether every rule was already there. A full
// sync runs it before its restores, when its look at the tables found a
// jump missing (with iptables-legacy every single iptables command reads a
// whole table: 12 -C checks cost 1.5 s at 10k services).
func ensureJumps(ctx context.Context, netNS int, fl *flavour, f ipFamily, ipt *goipt.IPTables) (intact bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	intact = true
	err = inNetNS(netNS, func() error {
		for _, j := range slices.Backward(jumps) {
			// -C fails outright when the target chain is missing.
			created, err := ensureChain(ipt, j.table, j.to)
			ok := false
			if err == nil {
				ok, err = ipt.Exists(j.table, j.from, j.spec()...)
			}
			if err == nil && !ok {
				err = ipt.Insert(j.table, j.from, 1, j.spec()...)
			}
			intact = intact && !created && ok
			if err != nil {
				if lerr := xtables.CheckLock(fl.tools(f).iptables, nil, err); lerr != nil {
					return lerr
				}
				return fmt.Errorf("iptables: add jump %s %s -> %s: %w", j.table, j.from, j.to, err)
			}
		}
		return nil
	})
	return intact, err
}

// jumpRestores returns, per table, a restore text that adds the missing
// jump rules whose target chain look does not have either, creating the
// chain (such a jump cannot be there: a rule cannot jump to a chain that
// does not exist), each at the head of its built-in chain as ensureJumps
// would; and the other missing jumps, to be checked one by one. On a
// fresh or flushed node this replaces 36 iptables commands per family
// with two restores.
func jumpRestores(missing []jump, look map[string]*tableLook) (texts map[string][]byte, rest []jump) {
	texts = map[string][]byte{}
	declared := map[string]bool{}
	for _, j := range slices.Backward(jumps) {
		if !slices.Contains(missing, j) {
			continue
		}
		if _, ok := look[j.table].counts[j.to]; ok {
			rest = append(rest, j)
			continue
		}
		t := texts[j.table]
		if t == nil {
			t = []byte("*" + j.table + "\n")
		}
		if !declared[j.table+" "+j.to] {
			t, declared[j.table+" "+j.to] = declare(t, j.to), true
		}
		texts[j.table] = appendRule(t, "-I", j.from, "1 "+strings.Join(quoteArgs(j.spec()), " "))
	}
	for table, t := range texts {
		texts[table] = append(t, "COMMIT\n"...)
	}
	return texts, rest
}

// ensureChain creates chain in table unless it exists, and says whether
// it did.
func ensureChain(ipt *goipt.IPTables, table, chain string) (created bool, err error) {
	ok, err := ipt.ChainExists(table, chain)
	if err == nil && !ok {
		err, created = ipt.NewChain(table, chain), true
	}
	if err != nil {
		return false, fmt.Errorf("iptables: create chain %s %s: %w", table, chain, err)
	}
	return created, nil
}

// quoteArgs quotes the arguments with spaces, as iptables-save prints
// them and iptables-restore reads them.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.Contains(a, " ") {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return out
}

// ownedChains lists the chains of one table of the kernel that removable
// says are to go, read with iptables-save; also the rules of other chains
// that jump into them.
func ownedChains(ctx context.Context, netNS int, save, table string, removable func(string) bool) (chains []string, refs [][]string, err error) {
	out, err := runSave(ctx, netNS, save, table)
	if err != nil {
		return nil, nil, err
	}
	for line := range bytes.Lines(out) {
		l := strings.TrimSpace(string(line))
		if name, ok := strings.CutPrefix(l, ":"); ok {
			if name, _, _ = strings.Cut(name, " "); removable(name) {
				chains = append(chains, name)
			}
			continue
		}
		if rest, ok := strings.CutPrefix(l, "-A "); ok {
			if args := splitRule(rest); len(args) > 0 && !removable(args[0]) && removable(ruleTarget(args)) {
				refs = append(refs, args)
			}
		}
	}
	return chains, refs, nil
}

// ruleTarget returns the chain a rule jumps or goes to, or "".
func ruleTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" || args[i] == "--jump" || args[i] == "--goto" {
			return args[i+1]
		}
	}
	return ""
}

// splitRule splits a rule as iptables-save prints it into arguments:
// separated by spaces, double quotes around arguments with spaces, and
// backslash escaping a quote or backslash inside them.
func splitRule(s string) []string {
	var args []string
	var cur strings.Builder
	inArg, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted, inArg = !quoted, true
		case c == ' ' && !quoted:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
			}
			inArg = false
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// cleanupTable removes the chains of one table that removable names:
// first every rule of another chain that jumps into one of them (with
// go-iptables), then the chains themselves, flushed and deleted in one
// iptables-restore. It returns how many chains it removed.
func cleanupTable(ctx context.Context, netNS int, ipt *goipt.IPTables, t tools, table string, removable func(string) bool) (int, error) {
	chains, refs, err := ownedChains(ctx, netNS, t.save, table, removable)
	if err != nil {
		return 0, err
	}
	err = inNetNS(netNS, func() error {
		var errs []error
		for _, r := range refs {
			if err := ipt.DeleteIfExists(table, r[0], r[1:]...); err != nil {
				errs = append(errs, fmt.Errorf("iptables: delete %s rule -A %s: %w", table, strings.Join(r, " "), err))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil || len(chains) == 0 {
		return 0, err
	}
	var text bytes.Buffer
	fmt.Fprintf(&text, "*%s\n", table)
	for _, c := range chains {
		fmt.Fprintf(&text, ":%s - [0:0]\n", c)
	}
	for _, c := range chains {
		fmt.Fprintf(&text, "-X %s\n", c)
	}
	text.WriteString("COMMIT\n")
	if err := runRestore(ctx, netNS, t.restore, text.Bytes()); err != nil {
		return 0, err
	}
	return len(chains), nil
}
