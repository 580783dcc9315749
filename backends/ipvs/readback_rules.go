package ipvs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/sdk/plan"
)

// familyRules is the iptables layer of one family, as read back.
type familyRules struct {
	// filterOK says that INPUT jumps to the filter chain and the chain
	// holds Weir's rules: the drop and firewall sets take effect.
	filterOK bool
	// nodeFirewallOK says that mangle OUTPUT jumps to the chain checking
	// the node's own connections against source ranges, and it is
	// intact: with filterOK, the source ranges hold for every source.
	nodeFirewallOK bool
	// shortCircuitOK says that the mangle chains leading to the
	// short-circuit rules are intact.
	shortCircuitOK bool
	// marks are the short-circuit rules: destination → mark.
	marks map[vsKey]uint32
}

// savedTable is one table of an iptables-save: its chains and the rules
// of each, without the "-A CHAIN " prefix.
type savedTable struct {
	chains map[string]bool
	rules  map[string][]string
}

// parseSave reads the text of one table of iptables-save (or the
// iptables-restore input Weir writes).
func parseSave(text []byte) savedTable {
	t := savedTable{chains: map[string]bool{}, rules: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			t.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			t.rules[chain] = append(t.rules[chain], rule)
		}
	}
	return t
}

// splitTables splits iptables-restore input into its tables' texts.
func splitTables(text []byte) map[string][]byte {
	out := map[string][]byte{}
	var name string
	for line := range strings.Lines(string(text)) {
		if strings.HasPrefix(line, "*") {
			name = strings.TrimSpace(line[1:])
			continue
		}
		out[name] = append(out[name], line...)
	}
	return out
}

// readRules reads the layer's chains of both families with iptables-save
// and checks them against the rules Weir writes.
func (b *Backend) readRules(ctx context.Context, bad *anomalies) (map[int]*familyRules, error) {
	node := plan.Node{PodCIDRs: b.masq.podCIDRs}
	// Before a sync the node's pod CIDRs, which these chains follow under
	// the NodeCIDR detector, are not known.
	unknown := map[string]bool{}
	if !b.synced && b.opts.Detector() == backends.DetectNodeCIDR {
		unknown = map[string]bool{chainClusterIP: true, chainMarkPods: true}
	}
	out := map[int]*familyRules{}
	for _, t := range b.masq.tools {
		want := splitTables(renderRules(t.family, &b.opts.Common, node, nil))
		got := map[string]savedTable{}
		for _, lc := range layerChains {
			text, err := xtables.Save(ctx, b.opts.NetNS, t.save, lc.table)
			if err != nil {
				return nil, fmt.Errorf("ipvs: %w", err)
			}
			got[lc.table] = parseSave(text)
		}
		out[t.family] = checkRules(t.family, got, want, unknown, bad)
	}
	return out, nil
}

// checkRules compares one family's tables got with the rules Weir writes
// (want, iptables-restore input per table), noting each difference, and
// reads the short-circuit rules. Chains in skip are not compared.
func checkRules(f int, got map[string]savedTable, want map[string][]byte, skip map[string]bool, bad *anomalies) *familyRules {
	broken := map[string]bool{}
	for _, lc := range layerChains {
		w := parseSave(want[lc.table])
		g := got[lc.table]
		for _, c := range lc.chains {
			where := fmt.Sprintf("IPv%d %s chain %s", f, lc.table, c)
			switch {
			case !g.chains[c]:
				bad.add(where+" is missing", "")
				broken[c] = true
			case c == chainShortCircuit || skip[c]:
			case !slices.Equal(g.rules[c], w.rules[c]):
				bad.add(where+" differs from what Weir writes", ruleDifference(g.rules[c], w.rules[c]))
				broken[c] = true
			}
		}
	}
	for _, j := range jumps {
		if !hasJump(got[j.table].rules[j.from], j.to) {
			bad.add(fmt.Sprintf("IPv%d %s chain %s does not jump to %s", f, j.table, j.from, j.to), "")
			broken[j.to] = true
		}
	}
	r := &familyRules{
		filterOK:       !broken[chainFilter],
		nodeFirewallOK: !broken[chainNodeFirewall],
		shortCircuitOK: !broken[chainMarkPods] && !broken[chainMarkNode] && !broken[chainShortCircuit],
		marks:          map[vsKey]uint32{},
	}
	for _, rule := range got["mangle"].rules[chainShortCircuit] {
		m, ok := parseMarkRule(rule)
		if !ok || familyOf(m.addr) != f {
			bad.add(fmt.Sprintf("IPv%d mangle chain %s holds rules Weir does not write", f, chainShortCircuit), rule)
			continue
		}
		r.marks[vsKey{addr: m.addr, proto: m.proto, port: m.port}] = m.mark
	}
	return r
}

// hasJump reports whether one of rules jumps to chain.
func hasJump(rules []string, chain string) bool {
	return slices.ContainsFunc(rules, func(r string) bool { return strings.HasSuffix(r, "-j "+chain) })
}

// ruleDifference describes how the rules got differ from want: the first
// rule that differs.
func ruleDifference(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("%d rules, want %d; rule %d is %q, want %q", len(got), len(want), i+1, g, w)
		}
	}
	return ""
}

// parseMarkRule reads a short-circuit rule as iptables-save prints it:
// "-d 198.51.100.5/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark
// 0x10000/0xffffffff".
func parseMarkRule(rule string) (markRule, bool) {
	var r markRule
	var ok [4]bool
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		v := f[i+1]
		switch f[i] {
		case "-d":
			p, err := netip.ParsePrefix(v)
			r.addr, ok[0] = p.Addr().Unmap(), err == nil && p.IsSingleIP()
		case "-p":
			r.proto = plan.Protocol(strings.ToUpper(v))
			ok[1] = protoNumber(r.proto) != 0
		case "--dport":
			n, err := strconv.ParseUint(v, 10, 16)
			r.port, ok[2] = uint16(n), err == nil
		case "--set-xmark":
			mark, mask, _ := strings.Cut(v, "/")
			m, err := strconv.ParseUint(mark, 0, 32)
			r.mark, ok[3] = uint32(m), err == nil && mask == "0xffffffff" && inMarkRange(uint32(m))
		}
	}
	return r, ok == [4]bool{true, true, true, true}
}
