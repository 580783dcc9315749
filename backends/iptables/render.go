package iptables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// restore is the text for one iptables-restore --noflush run per table. A
// nil table has nothing to change and needs no run.
type restore struct {
	Filter, NAT []byte
	// Full is set on a render of everything (renderFull), which
	// iptables-nft needs to be told about: see listFirst.
	Full bool
}

// The masquerade mark, kube-proxy's: KUBE-MARK-MASQ sets it and
// KUBE-POSTROUTING masquerades what carries it. unmarkMasq clears it.
const (
	masqMark   = "0x4000"
	unmarkMasq = "0xffffbfff"
)

// nodePortsComment is the comment of the node-port jumps that end the nat
// KUBE-SERVICES chain, kube-proxy's.
const nodePortsComment = "kubernetes service nodeports; NOTE: this must be the last rule in this chain"

// masqMode says how cluster-IP traffic is marked for masquerading.
type masqMode uint8

const (
	// masqNone marks nothing: no detector information (ClusterCIDR mode
	// without cluster CIDRs).
	masqNone masqMode = iota
	// masqAll marks everything (masqueradeAll, or NodeCIDR before the
	// node's podCIDRs are known).
	masqAll
	// masqNotPod marks what detection.notPod matches.
	masqNotPod
	// masqUnmarkPods marks everything, then unmarks each of several pod
	// ranges (iptables cannot negate several ranges in one rule).
	masqUnmarkPods
)

// detection is the local traffic detector of one family: how rules tell
// pod traffic from the rest.
type detection struct {
	masq masqMode
	// notPod matches traffic from elsewhere than pods ("! -s CIDR",
	// "! -i veth+") for masqNotPod.
	notPod string
	// podMatch are alternatives that each match pod traffic ("-s CIDR",
	// "-i veth+"); none when pods are not recognised.
	podMatch []string
	// nodeCIDRs are the node's podCIDRs of the family, with DetectNodeCIDR:
	// the rules depend on them, so a change rewrites everything.
	nodeCIDRs []netip.Prefix
}

// newDetection returns the detector options o ask for, in family f, for
// the node as the plan describes it.
func newDetection(f ipFamily, o *Options, node plan.Node) detection {
	d := detection{masq: masqNone} // until the detector below knows pods
	var cidrs []netip.Prefix
	switch o.Detector() {
	case backends.DetectNodeCIDR:
		cidrs = prefixesOf(f, node.PodCIDRs)
		d.nodeCIDRs = cidrs
		if len(cidrs) == 0 {
			d.masq = masqAll
		}
	case backends.DetectInterfaceNamePrefix:
		d.podMatch = []string{"-i " + o.PodInterfacePrefix + "+"}
		d.masq, d.notPod = masqNotPod, "! -i "+o.PodInterfacePrefix+"+"
	default:
		cidrs = prefixesOf(f, o.ClusterCIDRs)
	}
	for _, c := range cidrs {
		d.podMatch = append(d.podMatch, "-s "+c.String())
	}
	switch {
	case len(cidrs) == 1:
		d.masq, d.notPod = masqNotPod, "! -s "+cidrs[0].String()
	case len(cidrs) > 1:
		d.masq = masqUnmarkPods
	}
	if o.MasqueradeAll {
		d.masq = masqAll
	}
	return d
}

// prefixesOf returns the distinct prefixes of family f, masked.
func prefixesOf(f ipFamily, in []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range in {
		if f.has(p.Addr()) && !slices.Contains(out, p.Masked()) {
			out = append(out, p.Masked())
		}
	}
	return out
}

// renderer renders services of one family; not safe for concurrent use.
type renderer struct {
	f                  ipFamily
	o                  *Options
	det                detection
	localhostNodePorts bool
	// nodeIP is the node's IP of the family (backends.NodeIP): source
	// ranges holding it let the load-balancer IPs in as sources.
	nodeIP netip.Addr
	// quiet leaves the comments out of the per-endpoint rules (KUBE-SEP
	// chains and the rules choosing them), as kube-proxy does in large
	// clusters: see largeCluster.
	quiet bool
	// out is the last service rendered; scratch is reused for rule specs.
	out     serviceText
	scratch spec
}

// newRenderer returns a renderer for family f with the detector o asks
// for on the node the plan describes.
func newRenderer(f ipFamily, o *Options, node plan.Node) *renderer {
	return &renderer{f: f, o: o, det: newDetection(f, o, node), localhostNodePorts: o.LocalhostNodePorts && f == ipv4,
		nodeIP: backends.NodeIP(node, f == ipv6), out: serviceText{text: make([]byte, 0, 4096)}, scratch: make(spec, 0, 256)}
}

// The fixed chains of each table, declared (created or flushed) by every
// full sync.
var (
	natChains    = []string{kubeServices, kubeNodePorts, kubePostrouting, kubeMarkMasq}
	filterChains = []string{kubeServices, kubeExternalServices, kubeForward, kubeNodePorts, kubeProxyFirewall}
)

// renderFull renders everything for family f; existing (may be nil) lists
// KUBE-* chain names found in the kernel at takeover (nat and filter), so
// orphans are flushed and deleted.
//
// existing is keyed "nat" and "filter"; of its chains, the per-service
// ones (KUBE-SVC-, KUBE-SVL-, KUBE-EXT-, KUBE-FW-, KUBE-SEP-, KUBE-XLB-)
// that the plan no longer needs are deleted, others are left alone. After
// a failed restore, pass chainsOf of both the last good and the failed
// written, so chains a half-applied sync created are deleted too.
func renderFull(f ipFamily, p *plan.Plan, o *Options, existing map[string][]string) (restore, *written) {
	r := newRenderer(f, o, p.Node)
	w := &written{family: f, base: make(map[plan.Key]*svcWritten, len(p.Services)), podCIDRs: r.det.nodeCIDRs,
		nodeIP: r.nodeIP, ranged: map[plan.Key]bool{}}
	w.trailer = r.nodePortJumps(p.Node)
	for _, s := range p.Services {
		w.endpoints += len(s.Endpoints)
	}
	w.quiet = largeCluster(w.endpoints)
	r.quiet = w.quiet
	// Sizes as measured for plain cluster IPs, so the buffers rarely grow.
	natBody := make([]byte, 0, 1024+500*len(p.Services)+420*w.endpoints)
	filter := make([]byte, 0, 4096)
	filter = declare(append(filter, "*filter\n"...), filterChains...)
	natBody = r.staticNAT(natBody)
	filter = r.staticFilter(filter)
	var chains []string
	for _, k := range p.Keys() {
		rec := r.render(p.Services[k])
		for _, c := range r.out.chains {
			chains = append(chains, c.name)
		}
		for _, sr := range r.out.rules {
			if sr.table == natTable {
				natBody = appendRule(natBody, "-A", sr.chain, sr.spec)
			} else {
				filter = appendRule(filter, "-A", sr.chain, sr.spec)
			}
		}
		natBody = append(natBody, r.out.text...)
		w.base[k] = rec
		if rec.ranged {
			w.ranged[k] = true
		}
	}
	for _, s := range w.trailer {
		natBody = appendRule(natBody, "-A", kubeServices, s)
	}
	natOrphans := orphans(existing["nat"], w.natChains)
	filterOrphans := orphans(existing["filter"], func() map[string]bool { return nil })
	filter = deleteChains(declare(filter, filterOrphans...), filterOrphans)
	chains = append(chains, natOrphans...)
	if o.Flavour == flavourLegacy {
		// libiptc keeps user chains in a sorted list: created in descending
		// order, each goes to its head (1.8.9: a cold sync at 10k services
		// takes 8 s rather than 10 s). Not for iptables-nft: see listFirst.
		slices.SortFunc(chains, func(a, b string) int { return strings.Compare(b, a) })
	}
	nat := make([]byte, 0, 256+40*len(chains)+len(natBody)+20*len(natOrphans)+8)
	nat = declare(declare(append(nat, "*nat\n"...), natChains...), chains...)
	nat = deleteChains(append(nat, natBody...), natOrphans)
	return restore{Filter: append(filter, "COMMIT\n"...), NAT: append(nat, "COMMIT\n"...), Full: true}, w
}

// largeClusterEndpoints is kube-proxy's threshold of endpoints (in one
// family's plan) above which it drops the comments of per-endpoint rules:
// they triple the size of the legacy kernel blob every change rewrites.
const largeClusterEndpoints = 1000

// largeCluster says whether a plan with this many endpoints is rendered
// without per-endpoint comments.
func largeCluster(endpoints int) bool { return endpoints > largeClusterEndpoints }

// render renders svc (nil: absent) into r.out and returns what it
// writes; a service without rules in the family writes no chains but is
// recorded for its endpoint count.
func (r *renderer) render(svc *plan.Service) *svcWritten {
	r.out.text, r.out.chains, r.out.rules = r.out.text[:0], r.out.chains[:0], r.out.rules[:0]
	if svc == nil {
		return nil
	}
	m := newModel(svc, r.f, r.nodeIP)
	if m != nil {
		r.service(m)
	}
	rec := r.out.record()
	rec.endpoints = len(svc.Endpoints)
	rec.ranged = m != nil && m.ranged()
	return rec
}

// staticNAT appends the nat rules that do not depend on services.
func (r *renderer) staticNAT(b []byte) []byte {
	b = appendRule(b, "-A", kubePostrouting, "-m mark ! --mark "+masqMark+"/"+masqMark+" -j RETURN")
	b = appendRule(b, "-A", kubePostrouting, "-j MARK --xor-mark "+masqMark)
	b = appendRule(b, "-A", kubePostrouting,
		`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	return appendRule(b, "-A", kubeMarkMasq, "-j MARK --or-mark "+masqMark)
}

// staticFilter appends the filter rules that do not depend on services:
// the drop of invalid packets (unless KeepInvalid), forwarding of service
// traffic, and with localhost node ports the drop of
// packets to 127.0.0.0/8 from elsewhere (which route_localnet would let in).
func (r *renderer) staticFilter(b []byte) []byte {
	if !r.o.KeepInvalid {
		b = appendRule(b, "-A", kubeForward, "-m conntrack --ctstate INVALID -j DROP")
	}
	b = appendRule(b, "-A", kubeForward,
		`-m comment --comment "kubernetes forwarding rules" -m mark --mark `+masqMark+"/"+masqMark+" -j ACCEPT")
	b = appendRule(b, "-A", kubeForward,
		`-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	if r.localhostNodePorts {
		b = appendRule(b, "-A", kubeProxyFirewall,
			`-m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -j DROP`)
	}
	return b
}

// nodePortJumps returns the rules that end nat KUBE-SERVICES: the jumps to
// KUBE-NODEPORTS for the destinations that accept node ports (local
// addresses, limited by nodePortAddresses; loopback only with
// localhostNodePorts, and then only from the node itself).
func (r *renderer) nodePortJumps(node plan.Node) []string {
	lo := r.f.loopback()
	var out []string
	begin := func() spec { return spec(nil).comment(nodePortsComment) }
	done := func(s spec) { out = append(out, string(s[1:])) }
	cidrs := prefixesOf(r.f, r.o.NodePortCIDRs)
	switch {
	case r.o.NodePortPrimary:
		for _, a := range addrsOf(r.f, node.Addresses) {
			if !a.IsLoopback() {
				done(begin().dst(a).arg("-m", "addrtype", "--dst-type", "LOCAL").jump(kubeNodePorts))
			}
		}
	case len(cidrs) > 0:
		if slices.ContainsFunc(cidrs, lo.Overlaps) {
			done(begin().dstNet(lo, false).jump("RETURN"))
		}
		for _, c := range cidrs {
			done(begin().dstNet(c, false).arg("-m", "addrtype", "--dst-type", "LOCAL").jump(kubeNodePorts))
		}
	case len(r.o.NodePortCIDRs) > 0:
		// Only ranges of the other family: no node ports in this one.
	default:
		done(begin().arg("-m", "addrtype", "--dst-type", "LOCAL").dstNet(lo, true).jump(kubeNodePorts))
		if r.localhostNodePorts {
			// Loopback destinations only from the node itself; from
			// elsewhere they stay untranslated and KUBE-PROXY-FIREWALL
			// drops them.
			done(begin().src(lo, false).dstNet(lo, false).jump(kubeNodePorts))
		}
	}
	return out
}

// declare appends a ":CHAIN - [0:0]" line per chain: creates the chain, or
// flushes it when it exists (iptables-restore --noflush).
func declare(b []byte, chains ...string) []byte {
	for _, c := range chains {
		b = append(b, ':')
		b = append(b, c...)
		b = append(b, " - [0:0]\n"...)
	}
	return b
}

// deleteChains appends a "-X CHAIN" line per chain.
func deleteChains(b []byte, chains []string) []byte {
	for _, c := range chains {
		b = append(b, "-X "...)
		b = append(b, c...)
		b = append(b, '\n')
	}
	return b
}

// appendRule appends "op chain spec\n".
func appendRule(b []byte, op, chain, s string) []byte {
	b = append(b, op...)
	b = append(b, ' ')
	b = append(b, chain...)
	b = append(b, ' ')
	b = append(b, s...)
	return append(b, '\n')
}

// orphans returns the per-service chains of existing that keep does not
// hold, sorted; keep is only called when there are candidates.
func orphans(existing []string, keep func() map[string]bool) []string {
	var out []string
	var kept map[string]bool
	for _, c := range existing {
		if !isServiceChain(c) {
			continue
		}
		if kept == nil {
			if kept = keep(); kept == nil {
				kept = map[string]bool{}
			}
		}
		if !kept[c] {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
