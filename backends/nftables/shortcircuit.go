package nftables

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/backends"
)

// Traffic from this node or from its pods to the external addresses (node
// ports, external and load-balancer IPs) of an externalTrafficPolicy: Local
// service is not external traffic: like kube-proxy, Weir sends it to the
// cluster's endpoints instead of this node's only, masquerading what the node
// itself sends. These maps hold the entries of such services only.
const (
	setShortIPs       = "local-origin-ips"       // external IP . proto . port : goto pick-short-ip-W
	setShortNodePorts = "local-origin-nodeports" // proto . port : goto pick-short-np-W
)

// shortCircuitRules send node- and pod-originated packets for Local-policy
// external addresses to their cluster pick chains; they come first in the
// services chain.
func (l *layout) shortCircuitRules(t *txn, c *nftables.Chain) {
	type origin struct {
		text  string
		exprs []expr.Any
	}
	origins := []origin{{"fib saddr type local ", saddrLocal()}}
	if text, exprs := l.podSource(); exprs != nil {
		origins = append(origins, origin{text, exprs})
	}
	npMatch, npText := l.nodePortMatch()
	for _, o := range origins {
		t.add(op{kind: opAddRule, chain: c, rule: &rule{
			text:  o.text + "ip daddr . meta l4proto . th dport vmap @" + setShortIPs,
			exprs: append(append(clone(o.exprs), l.fam.ipKeyExprs()...), mapTo(regKey, setShortIPs, regVerdict)),
		}})
		t.add(op{kind: opAddRule, chain: c, rule: &rule{
			text:  o.text + npText + "meta l4proto . th dport vmap @" + setShortNodePorts,
			exprs: append(append(append(clone(o.exprs), clone(npMatch)...), portKeyExprs()...), mapTo(regKey, setShortNodePorts, regVerdict)),
		}})
	}
}

// podSource matches packets the local-traffic detector recognises as coming
// from this cluster's pods; nil when there is no detector.
func (l *layout) podSource() (string, []expr.Any) {
	switch {
	case l.opts.LocalDetector == backends.DetectNodeCIDR:
		return "ip saddr @" + setPodCIDRs + " ", []expr.Any{l.fam.loadSaddr(regKey), lookup(regKey, setPodCIDRs, false)}
	case l.opts.LocalDetector == backends.DetectInterfaceNamePrefix:
		return fmt.Sprintf("iifname %q ", l.opts.PodInterfacePrefix+"*"), iifnamePrefix(l.opts.PodInterfacePrefix)
	case len(l.opts.ClusterCIDRs) > 0:
		return "ip saddr @" + setClusterCIDRs + " ", []expr.Any{l.fam.loadSaddr(regKey), lookup(regKey, setClusterCIDRs, false)}
	}
	return "", nil
}

// shortCircuitMasquerade marks what the node itself sends to a Local-policy
// external address: replies from a remote endpoint must come back here.
func shortCircuitMasquerade() *rule {
	return &rule{
		text:  fmt.Sprintf("fib saddr type local meta mark set meta mark | %#x", masqueradeMark),
		exprs: append(saddrLocal(), setMarkBit(masqueradeMark, false)...),
	}
}

func clone(e []expr.Any) []expr.Any { return append([]expr.Any(nil), e...) }
