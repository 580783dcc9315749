package nftables

import (
	"github.com/google/nftables"
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
	origins := []match{fromLocal()}
	if pods, ok := l.podSource(); ok {
		origins = append(origins, pods)
	}
	nodePorts := l.nodePortMatch()
	for _, o := range origins {
		t.addRule(c, o, l.fam.serviceKey().vmap(setShortIPs))
		t.addRule(c, o, nodePorts, nodePortKey().vmap(setShortNodePorts))
	}
}

// podSource matches packets the local-traffic detector recognises as coming
// from this cluster's pods; false when there is no detector.
func (l *layout) podSource() (match, bool) {
	switch {
	case l.opts.LocalDetector == backends.DetectNodeCIDR:
		return l.fam.saddrKey().in(setPodCIDRs), true
	case l.opts.LocalDetector == backends.DetectInterfaceNamePrefix:
		return iifname(l.opts.PodInterfacePrefix, true), true
	case len(l.opts.ClusterCIDRs) > 0:
		return l.fam.saddrKey().in(setClusterCIDRs), true
	}
	return match{}, false
}

// shortCircuitMasquerade marks what the node itself sends to a Local-policy
// external address: replies from a remote endpoint must come back here.
func shortCircuitMasquerade() *rule {
	return ruleOf(fromLocal(), markMasquerade())
}
