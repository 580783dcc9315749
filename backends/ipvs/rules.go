package ipvs

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// The chains of the fixed iptables layer: four in the nat table, one in
// the filter table, four in the mangle table.
const (
	// chainServices, jumped to from PREROUTING and OUTPUT, marks the
	// packets to service addresses that must be masqueraded.
	chainServices = "WEIR-IPVS-SERVICES"
	// chainClusterIP decides for cluster-IP packets, as the local traffic
	// detector says.
	chainClusterIP = "WEIR-IPVS-CLUSTER-IP"
	// chainMarkMasq sets the masquerade mark.
	chainMarkMasq = "WEIR-IPVS-MARK-MASQ"
	// chainPostrouting, jumped to from POSTROUTING, masquerades marked
	// and hairpin packets.
	chainPostrouting = "WEIR-IPVS-POSTROUTING"
	// chainFilter, in the filter table and jumped to from INPUT, drops new
	// connections that source ranges or Local traffic policies refuse,
	// before IPVS (on LOCAL_IN, after the filter table) sees them.
	chainFilter = "WEIR-IPVS-FILTER"
	// chainMarkPods and chainMarkNode, in the mangle table and jumped to
	// from PREROUTING and OUTPUT, send pod and node traffic to Local
	// services' external destinations to chainShortCircuit, which marks
	// it (see shortcircuit.go).
	chainMarkPods     = "WEIR-IPVS-MARK-PODS"
	chainMarkNode     = "WEIR-IPVS-MARK-NODE"
	chainShortCircuit = "WEIR-IPVS-SHORT-CIRCUIT"
	// chainNodeFirewall, in the mangle table and jumped to from OUTPUT,
	// drops the node's own new connections that source ranges refuse.
	// IPVS takes them in LOCAL_OUT, before the filter table's OUTPUT and
	// without passing INPUT, so only mangle sees them still headed for
	// the load-balancer IP (kube-proxy's IPVS mode drops them after IPVS,
	// matching the virtual server with -m ipvs).
	chainNodeFirewall = "WEIR-IPVS-NODE-FIREWALL"
)

// The masquerade mark, kube-proxy's bit, as the other backends use it.
// The rules set and clear it in the form iptables-save prints
// (--set-xmark value/mask: --or-mark 0x4000 is 0x4000/0x4000, --xor-mark
// 0x4000 is 0x4000/0x0), so that the read-back compares them as text.
const (
	masqMark    = "0x4000"
	setMasqMark = "--set-xmark 0x4000/0x4000"
	flipMasq    = "--set-xmark 0x4000/0x0"
)

// layerChains lists the layer's chains per table, in declaration order.
var layerChains = []struct {
	table  string
	chains []string
}{
	{"nat", []string{chainServices, chainClusterIP, chainMarkMasq, chainPostrouting}},
	{"filter", []string{chainFilter}},
	{"mangle", []string{chainMarkPods, chainMarkNode, chainShortCircuit, chainNodeFirewall}},
}

// jump is a rule in a built-in chain sending packets to one of the
// layer's chains.
type jump struct {
	table, from, to, comment string
}

// jumps are the layer's rules in the built-in chains.
var jumps = []jump{
	{"nat", "PREROUTING", chainServices, "weir IPVS service masquerading"},
	{"nat", "OUTPUT", chainServices, "weir IPVS service masquerading"},
	{"nat", "POSTROUTING", chainPostrouting, "weir IPVS masquerading"},
	{"filter", "INPUT", chainFilter, "weir IPVS source ranges and Local-policy drops"},
	{"mangle", "PREROUTING", chainMarkPods, "weir IPVS pod traffic to Local services"},
	{"mangle", "OUTPUT", chainMarkNode, "weir IPVS node traffic to Local services"},
	{"mangle", "OUTPUT", chainNodeFirewall, "weir IPVS source ranges for the node's own connections"},
}

func (j jump) spec() []string {
	return []string{"-m", "comment", "--comment", j.comment, "-j", j.to}
}

// renderRules returns the iptables-restore input of family f (4 or 6):
// the nat, filter and mangle tables with every chain of the layer
// declared, which flushes it, and its rules. Only the mangle table depends
// on the services (their short-circuit marks); the rest depends on the
// options and the node's pod CIDRs.
func renderRules(f int, o *backends.Common, node plan.Node, marks []markRule) []byte {
	var b strings.Builder
	rule := func(chain string, args ...string) {
		b.WriteString("-A " + chain + " " + strings.Join(args, " ") + "\n")
	}
	match := func(set, dirs string) string { return "-m set --match-set " + familySet(set, f) + " " + dirs }
	declare := func(table string, chains []string) {
		b.WriteString("*" + table + "\n")
		for _, c := range chains {
			b.WriteString(":" + c + " - [0:0]\n")
		}
	}
	declare(layerChains[0].table, layerChains[0].chains)
	// Short-circuited packets must keep their mark exactly.
	rule(chainServices, "-m mark --mark", markMatch, "-j RETURN")
	// The node's own connections to a service address it holds leave from
	// that address (its own, and the best match): masqueraded, the
	// endpoint sees the node.
	rule(chainServices, match(setClusterIP, "src,dst"), "-g", chainMarkMasq)
	rule(chainServices, match(setExternal, "src,dst"), "-g", chainMarkMasq)
	rule(chainServices, match(setClusterIP, "dst,dst"), "-g", chainClusterIP)
	rule(chainServices, match(setExternalLocal, "dst,dst"), "-j RETURN")
	rule(chainServices, match(setExternal, "dst,dst"), "-g", chainMarkMasq)
	for _, r := range clusterIPRules(f, o, node) {
		rule(chainClusterIP, r)
	}
	rule(chainMarkMasq, "-j MARK", setMasqMark)
	rule(chainPostrouting, match(setHairpin, "dst,dst,src"), "-j MARK", setMasqMark)
	rule(chainPostrouting, "-m mark --mark", markMatch, "-m addrtype --src-type LOCAL -j MASQUERADE --random-fully")
	rule(chainPostrouting, "-m mark ! --mark "+masqMark+"/"+masqMark, "-j RETURN")
	rule(chainPostrouting, "-j MARK", flipMasq)
	rule(chainPostrouting, "-j MASQUERADE --random-fully")
	b.WriteString("COMMIT\n")
	declare(layerChains[1].table, layerChains[1].chains)
	rule(chainFilter, firewallDrop(f))
	rule(chainFilter, "-m mark --mark", markMatch, "-j RETURN")
	rule(chainFilter, "-m conntrack --ctstate NEW", match(setDrop, "dst,dst"), "-j DROP")
	b.WriteString("COMMIT\n")
	b.WriteString(renderMangle(f, o, node, marks))
	return []byte(b.String())
}

// firewallDrop is the rule of family f that drops new connections to a
// WEIR-IPVS-FIREWALL destination from a source WEIR-IPVS-SOURCE-RANGES
// does not allow it.
func firewallDrop(f int) string {
	return "-m conntrack --ctstate NEW -m set --match-set " + familySet(setFirewall, f) + " dst,dst -m set ! --match-set " +
		familySet(setSourceRanges, f) + " dst,dst,src -j DROP"
}

// renderEmpty returns the iptables-restore input that declares every
// chain of the layer, with no rule: it flushes them.
func renderEmpty() []byte {
	var b strings.Builder
	for _, t := range layerChains {
		b.WriteString("*" + t.table + "\n")
		for _, c := range t.chains {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// clusterIPRules are the rules of chainClusterIP in family f: pod
// traffic returns unmarked, the rest is marked. With MasqueradeAll
// everything is marked; without detector information (no ClusterCIDRs
// of the family) nothing is.
func clusterIPRules(f int, o *backends.Common, node plan.Node) []string {
	mark := "-g " + chainMarkMasq
	if o.MasqueradeAll {
		return []string{mark}
	}
	pods, detecting := podMatches(f, o, node)
	switch {
	case len(pods) > 0:
	case detecting:
		return []string{mark} // podCIDRs not known yet
	default:
		return nil
	}
	var out []string
	for _, m := range pods {
		out = append(out, m+" -j RETURN")
	}
	return append(out, mark)
}

// podMatches returns the iptables matches recognising pod traffic of
// family f as the local traffic detector says. detecting is true when the
// detector is configured to recognise pods but cannot yet (NodeCIDR
// before the node's podCIDRs are known).
func podMatches(f int, o *backends.Common, node plan.Node) (matches []string, detecting bool) {
	switch o.Detector() {
	case backends.DetectInterfaceNamePrefix:
		return []string{"-i " + o.PodInterfacePrefix + "+"}, true
	case backends.DetectNodeCIDR:
		return sourceMatches(f, node.PodCIDRs), true
	default:
		return sourceMatches(f, o.ClusterCIDRs), false
	}
}

// sourceMatches returns "-s CIDR" for each distinct prefix of family f.
func sourceMatches(f int, prefixes []netip.Prefix) []string {
	var out []string
	for _, p := range prefixes {
		if familyOf(p.Addr().Unmap()) != f {
			continue
		}
		m := "-s " + p.Masked().String()
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}
