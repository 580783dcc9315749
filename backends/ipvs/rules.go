package ipvs

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// The chains of the fixed iptables layer, all in the nat table.
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
)

// The masquerade mark, kube-proxy's bit, as the other backends use it.
const (
	masqMark = "0x4000"
)

// natChains lists the layer's chains in declaration order.
var natChains = []string{chainServices, chainClusterIP, chainMarkMasq, chainPostrouting}

// jump is a rule in a built-in chain of the nat table sending packets to
// one of the layer's chains.
type jump struct {
	from, to, comment string
}

// jumps are the layer's rules in the built-in chains.
var jumps = []jump{
	{"PREROUTING", chainServices, "weir IPVS service masquerading"},
	{"OUTPUT", chainServices, "weir IPVS service masquerading"},
	{"POSTROUTING", chainPostrouting, "weir IPVS masquerading"},
}

func (j jump) spec() []string {
	return []string{"-m", "comment", "--comment", j.comment, "-j", j.to}
}

// renderNAT returns the iptables-restore input of the nat table for
// family f (4 or 6): every chain declared, which flushes it, and its
// rules. It depends only on the options and the node's pod CIDRs.
func renderNAT(f int, o *backends.Common, node plan.Node) []byte {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range natChains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	rule := func(chain string, args ...string) {
		b.WriteString("-A " + chain + " " + strings.Join(args, " ") + "\n")
	}
	match := func(set, dirs string) string { return "-m set --match-set " + set + " " + dirs }
	rule(chainServices, match(familySet(setClusterIP, f), "dst,dst"), "-g", chainClusterIP)
	rule(chainServices, match(familySet(setExternalLocal, f), "dst,dst"), "-j RETURN")
	rule(chainServices, match(familySet(setExternal, f), "dst,dst"), "-g", chainMarkMasq)
	for _, r := range clusterIPRules(f, o, node) {
		rule(chainClusterIP, r)
	}
	rule(chainMarkMasq, "-j MARK --or-mark", masqMark)
	rule(chainPostrouting, match(familySet(setHairpin, f), "dst,dst,src"), "-j MARK --or-mark", masqMark)
	rule(chainPostrouting, "-m mark ! --mark "+masqMark+"/"+masqMark, "-j RETURN")
	rule(chainPostrouting, "-j MARK --xor-mark", masqMark)
	rule(chainPostrouting, "-j MASQUERADE --random-fully")
	b.WriteString("COMMIT\n")
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
	var pods []string
	switch o.Detector() {
	case backends.DetectInterfaceNamePrefix:
		pods = []string{"-i " + o.PodInterfacePrefix + "+"}
	case backends.DetectNodeCIDR:
		pods = sourceMatches(f, node.PodCIDRs)
		if len(pods) == 0 {
			return []string{mark} // podCIDRs not known yet
		}
	default:
		pods = sourceMatches(f, o.ClusterCIDRs)
		if len(pods) == 0 {
			return nil
		}
	}
	var out []string
	for _, m := range pods {
		out = append(out, m+" -j RETURN")
	}
	return append(out, mark)
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
