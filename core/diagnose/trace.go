package diagnose

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// TraceInput is one connection to explain, and what decides its fate.
type TraceInput struct {
	From     netip.Addr
	To       netip.AddrPort
	Protocol plan.Protocol
	// Plan is the final plan: after the hook plugins.
	Plan *plan.Plan
	// Mode is the proxy mode: only nftables drops connections to
	// addresses of the service CIDRs that no service has.
	Mode string
	// How pod traffic is recognised and masqueraded (the configuration's
	// detectLocalMode, clusterCIDRs, interface prefix and masqueradeAll).
	Detector      backends.LocalDetector
	ClusterCIDRs  []netip.Prefix
	PodInterface  string
	MasqueradeAll bool
}

// source says where a connection comes from, as the rules tell it.
type source int

const (
	fromOutside source = iota // another host
	fromNode                  // this node's own address or loopback
	fromPod                   // a pod, by the local-traffic detector
)

// Trace explains what the committed rules do with one new connection:
// the service it hits, the endpoints it can reach and how likely each
// is, whether the endpoint sees the client's address, or why it is
// dropped or rejected.
func Trace(in TraceInput) []Finding {
	t := tracer{in: in, subject: fmt.Sprintf("%s → %s/%s", in.From, in.To, in.Protocol)}
	view, owners := backends.Expect(in.Plan, backends.ExpectOptions{NodePortFamilies: []int{4, 6}})
	dest, fw, ok := t.destination(view)
	if !ok {
		return t.noService()
	}
	svc := in.Plan.Services[owners[dest]]
	t.add("trace.service", Info, "hits %s of %s (%s)", dest, owners[dest], t.sourceText())
	t.forwarding(dest, svc, fw)
	return t.out
}

type tracer struct {
	in      TraceInput
	subject string
	out     []Finding
}

func (t *tracer) add(code string, sev Severity, format string, args ...any) {
	t.out = append(t.out, Finding{Code: code, Severity: sev, Subject: t.subject, Message: fmt.Sprintf(format, args...)})
}

// destination finds what the connection is addressed to: a cluster,
// external or load-balancer IP, or a node port on one of this node's
// addresses (or loopback).
func (t *tracer) destination(view *backends.View) (backends.Destination, backends.Forwarding, bool) {
	to := t.in.To.Addr().Unmap()
	for _, kind := range []backends.DestinationKind{backends.DestCluster, backends.DestExternal} {
		d := backends.Destination{Kind: kind, Addr: to, Protocol: t.in.Protocol, Port: t.in.To.Port()}
		if fw, ok := view.Destinations[d]; ok {
			return d, fw, true
		}
	}
	if to.IsLoopback() || slices.Contains(t.in.Plan.Node.Addresses, to) {
		any := netip.IPv4Unspecified()
		if to.Is6() {
			any = netip.IPv6Unspecified()
		}
		d := backends.Destination{Kind: backends.DestNodePort, Addr: any, Protocol: t.in.Protocol, Port: t.in.To.Port()}
		if fw, ok := view.Destinations[d]; ok {
			return d, fw, true
		}
	}
	return backends.Destination{}, backends.Forwarding{}, false
}

// noService explains a connection no service's rules take.
func (t *tracer) noService() []Finding {
	to := t.in.To.Addr().Unmap()
	for _, p := range t.in.Plan.ServiceCIDRs {
		if p.Contains(to) && t.in.Mode == "nftables" {
			t.add("trace.dropped-no-service", Broken, "no service has %s/%s, which is inside the service range %s: dropped, as kube-proxy's nftables mode does",
				t.in.To, t.in.Protocol, p)
			return t.out
		}
	}
	t.add("trace.no-service", Info, "no service listens at %s/%s: Weir's rules leave the connection alone", t.in.To, t.in.Protocol)
	return t.out
}

// forwarding explains the verdict at the destination for this source.
func (t *tracer) forwarding(dest backends.Destination, svc *plan.Service, fw backends.Forwarding) {
	from := t.source()
	if fw.Allowed != nil && !slices.ContainsFunc(fw.Allowed, func(p netip.Prefix) bool { return p.Contains(t.in.From.Unmap()) }) {
		t.add("trace.dropped-source-range", Broken, "dropped: %s is outside the load balancer's source ranges (loadBalancerSourceRanges: %s)",
			t.in.From, prefixes(fw.Allowed))
		return
	}
	endpoints := fw.Endpoints
	external := dest.Kind != backends.DestCluster
	shortCircuit := external && fw.ShortCircuit != nil && from != fromOutside
	if shortCircuit {
		endpoints = fw.ShortCircuit
		t.add("trace.short-circuit", Info, "traffic from this node and its pods to an externalTrafficPolicy: Local service's external address goes to the cluster's endpoints, as with kube-proxy")
	}
	switch {
	case fw.Verdict == backends.VerdictReject:
		t.add("trace.rejected", Broken, "rejected: %s has no endpoints", svc.Key)
		return
	case fw.Verdict == backends.VerdictDrop && !shortCircuit:
		policy := "internalTrafficPolicy"
		if external {
			policy = "externalTrafficPolicy"
		}
		t.add("trace.dropped-policy", Broken, "dropped: %s is Local and no endpoint serves on this node", policy)
		return
	}
	t.add("trace.endpoints", Info, "goes to %s", shares(endpoints))
	if fw.AffinitySeconds > 0 {
		t.add("trace.affinity", Info, "ClientIP affinity: later connections from %s go to the same endpoint for %d s after the last", t.in.From, fw.AffinitySeconds)
	}
	t.add("trace.masquerade", Info, "%s", t.masquerade(dest, svc, from, shortCircuit, endpoints))
}

// masquerade says whether the endpoint sees the client's address.
func (t *tracer) masquerade(dest backends.Destination, svc *plan.Service, from source, shortCircuit bool, eps map[netip.AddrPort]uint32) string {
	hairpin := ""
	for ap := range eps {
		if ap.Addr() == t.in.From.Unmap() && (t.in.Mode != "nftables" || onThisNode(svc, ap.Addr())) {
			hairpin = fmt.Sprintf("; a connection that lands on %s itself is masqueraded (hairpin)", t.in.From)
		}
	}
	switch {
	case dest.Kind == backends.DestCluster || (shortCircuit && from == fromPod):
		return t.clusterMasquerade(from) + hairpin
	case shortCircuit || !svc.ExternalLocal:
		return "masqueraded: the endpoint sees this node's address" + hairpin
	}
	return fmt.Sprintf("not masqueraded: the endpoint sees %s (externalTrafficPolicy Local keeps the client's address)", t.in.From) + hairpin
}

// onThisNode reports whether the service's endpoint at addr runs on this
// node: in mode nftables only those are masqueraded when they reach
// themselves, as in kube-proxy's (modes iptables and ipvs masquerade every
// endpoint that does).
func onThisNode(svc *plan.Service, addr netip.Addr) bool {
	for _, e := range svc.Endpoints {
		if e.Address == addr && e.Local {
			return true
		}
	}
	return false
}

// clusterMasquerade is the cluster-IP rule: masqueradeAll, or traffic the
// local-traffic detector does not take for a pod's.
func (t *tracer) clusterMasquerade(from source) string {
	switch {
	case t.in.MasqueradeAll:
		return "masqueraded (masqueradeAll): the endpoint sees this node's address"
	case t.in.Detector == backends.DetectInterfaceNamePrefix:
		return fmt.Sprintf("masqueraded unless it arrives on an interface named %s*: the addresses alone cannot tell", t.in.PodInterface)
	case from == fromPod:
		return fmt.Sprintf("not masqueraded: the endpoint sees %s (pod traffic)", t.in.From)
	case t.in.Detector == backends.DetectClusterCIDR && len(t.in.ClusterCIDRs) == 0:
		return fmt.Sprintf("not masqueraded: the endpoint sees %s (no clusterCIDRs configured, so nothing is)", t.in.From)
	}
	return "masqueraded: the endpoint sees this node's address (the source is not a pod's)"
}

// source tells where the connection comes from.
func (t *tracer) source() source {
	from := t.in.From.Unmap()
	if from.IsLoopback() || slices.Contains(t.in.Plan.Node.Addresses, from) {
		return fromNode
	}
	ranges := t.in.ClusterCIDRs
	if t.in.Detector == backends.DetectNodeCIDR {
		ranges = t.in.Plan.Node.PodCIDRs
	}
	if slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(from) }) {
		return fromPod
	}
	return fromOutside
}

func (t *tracer) sourceText() string {
	switch t.source() {
	case fromNode:
		return "from this node"
	case fromPod:
		return "from a pod"
	}
	return "from outside the cluster's pods"
}

// shares lists endpoints with their share of new connections, largest
// first.
func shares(eps map[netip.AddrPort]uint32) string {
	var total uint64
	for _, w := range eps {
		total += uint64(w)
	}
	keys := slices.SortedFunc(maps.Keys(eps), func(a, b netip.AddrPort) int {
		return cmp.Or(cmp.Compare(eps[b], eps[a]), a.Compare(b))
	})
	parts := make([]string, len(keys))
	for i, ap := range keys {
		parts[i] = fmt.Sprintf("%s (%.1f%%)", ap, 100*float64(eps[ap])/float64(total))
	}
	return strings.Join(parts, ", ")
}
