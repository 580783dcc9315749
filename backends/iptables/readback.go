package iptables

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

var _ backends.Reader = (*Backend)(nil)

// ReadBack reads Weir's rules back from the kernel with iptables-save
// (tables nat and filter of both families) and rebuilds from kube-proxy's
// layout what they do with new connections; see backends.Reader. It never
// looks at what the backend remembers writing. It is for checking: with
// iptables-nft, iptables-save of 10k services takes minutes
// (docs/performance.md), and syncs never call it.
func (b *Backend) ReadBack(ctx context.Context) (*backends.View, error) {
	v := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{}}
	for _, fam := range b.fams {
		saved := map[string]*savedTable{}
		for _, table := range []string{tableNAT, tableFilter} {
			out, err := runSave(ctx, b.opts.NetNS, fam.tools.save, table)
			if err != nil {
				return nil, fmt.Errorf("iptables: read back: %w", err)
			}
			saved[table] = parseSave(out)
		}
		readFamily(v, fam.f, saved[tableNAT], saved[tableFilter])
	}
	return v, nil
}

// Expected returns the view ReadBack must return once p is committed:
// backends.Expect for the families in which this backend serves node
// ports (nodePortAddresses may leave one out, or, with NodePortPrimary,
// the node may have no address of a family), with no source ranges on the
// load-balancer IPs of services without endpoints in the family: as in
// kube-proxy's iptables mode, those are rejected for every source.
func (b *Backend) Expected(p *plan.Plan) (*backends.View, map[backends.Destination]plan.Key) {
	var fams []int
	for _, f := range []ipFamily{ipv4, ipv6} {
		if slices.ContainsFunc(newRenderer(f, &b.opts, p.Node).nodePortJumps(p.Node), func(s string) bool {
			return string(jumpTarget([]byte(s))) == kubeNodePorts
		}) {
			fams = append(fams, int(f))
		}
	}
	v, owners := backends.Expect(p, backends.ExpectOptions{NodePortFamilies: fams})
	for d, f := range v.Destinations {
		if f.Verdict == backends.VerdictReject && f.Allowed != nil {
			f.Allowed = nil
			v.Destinations[d] = f
		}
	}
	return v, owners
}

// familyReader rebuilds one family's part of a view from its saved nat
// and filter tables.
type familyReader struct {
	f           ipFamily
	nat, filter *savedTable
	v           *backends.View
	// used are the nat chains a rule leads to; followed remembers what
	// each chain followed so far does, so that its anomalies are told once.
	used     map[string]bool
	followed map[string]followed
	// nodePorts is set when nat KUBE-SERVICES jumps to KUBE-NODEPORTS.
	nodePorts bool
	// dropped are the destinations filter KUBE-PROXY-FIREWALL drops.
	dropped map[backends.Destination]bool
}

// followed is what a chain does with the new connections entering it.
type followed struct {
	fw backends.Forwarding
	// forwards is false when no endpoint gets the connections: they leave
	// the chain untranslated, for the filter table to reject or drop.
	forwards bool
}

// readFamily adds what the saved tables of family f do to v.
func readFamily(v *backends.View, f ipFamily, nat, filter *savedTable) {
	r := &familyReader{f: f, nat: nat, filter: filter, v: v, used: map[string]bool{}, followed: map[string]followed{},
		dropped: map[backends.Destination]bool{}}
	r.checkFixed()
	for _, rule := range nat.chains[kubeServices] {
		r.nodePorts = r.nodePorts || rule.target() == kubeNodePorts
	}
	pending := map[backends.Destination]bool{}
	r.dispatch(pending)
	r.filterVerdicts(pending)
	r.firewall()
	for d := range pending {
		r.anomaly("%s reaches no endpoint, and nothing rejects or drops it", d)
		delete(v.Destinations, d)
	}
	for _, chain := range slices.Sorted(maps.Keys(nat.chains)) {
		if isServiceChain(chain) && !r.used[chain] {
			r.anomaly("nat chain %s is used by no rule", chain)
		}
	}
	for chain := range filter.chains {
		if isServiceChain(chain) {
			r.anomaly("filter chain %s is not Weir's: per-service chains live in nat", chain)
		}
	}
}

// anomaly records an inconsistency, naming the family.
func (r *familyReader) anomaly(format string, args ...any) {
	r.v.Anomalies = append(r.v.Anomalies, fmt.Sprintf("IPv%d ", r.f)+fmt.Sprintf(format, args...))
}

// checkFixed reports missing fixed chains and jump rules.
func (r *familyReader) checkFixed() {
	tables := map[string]*savedTable{tableNAT: r.nat, tableFilter: r.filter}
	for table, chains := range map[string][]string{tableNAT: natChains, tableFilter: filterChains} {
		for _, c := range chains {
			if !tables[table].has(c) {
				r.anomaly("%s chain %s is missing", table, c)
			}
		}
	}
	for _, j := range jumps {
		spec := j.spec()
		if !slices.ContainsFunc(tables[j.table].chains[j.from], func(rule savedRule) bool { return slices.Equal(rule, spec) }) {
			r.anomaly("%s chain %s has no jump to %s", j.table, j.from, j.to)
		}
	}
}

// dispatch reads nat KUBE-SERVICES and KUBE-NODEPORTS: each destination
// and where its new connections go. Destinations whose chain forwards to
// no endpoint are left pending, for the filter table's verdict.
func (r *familyReader) dispatch(pending map[backends.Destination]bool) {
	for _, rule := range r.nat.chains[kubeServices] {
		t := rule.target()
		switch {
		case t == kubeNodePorts || t == "RETURN":
		case strings.HasPrefix(t, prefixSVC) || strings.HasPrefix(t, prefixSVL):
			r.dispatchTo(backends.DestCluster, rule, t, true, pending)
		case strings.HasPrefix(t, prefixEXT) || strings.HasPrefix(t, prefixFW):
			r.dispatchTo(backends.DestExternal, rule, t, true, pending)
		default:
			r.anomaly("nat chain %s has a rule Weir does not write: %s", kubeServices, rule)
		}
	}
	for _, rule := range r.nat.chains[kubeNodePorts] {
		if t := rule.target(); strings.HasPrefix(t, prefixEXT) {
			r.dispatchTo(backends.DestNodePort, rule, t, r.nodePorts, pending)
		} else {
			r.anomaly("nat chain %s has a rule Weir does not write: %s", kubeNodePorts, rule)
		}
	}
}

// dispatchTo records the destination of a dispatch rule and what its
// chain does, when record is set (node ports of a family that serves
// none are only followed, for the anomalies).
func (r *familyReader) dispatchTo(kind backends.DestinationKind, rule savedRule, chain string, record bool, pending map[backends.Destination]bool) {
	d, ok := r.destination(kind, rule)
	if !ok {
		r.anomaly("nat rule %s names no single address, protocol and port", rule)
		return
	}
	fl := r.follow(chain, d)
	if !record {
		return
	}
	if _, dup := r.v.Destinations[d]; dup {
		r.anomaly("%s is dispatched twice in nat; the first rule wins", d)
		return
	}
	r.v.Destinations[d] = fl.fw
	if !fl.forwards {
		pending[d] = true
	}
}

// destination reads a rule's destination: its -d host address (the
// family's unspecified address for a node port), protocol and port.
func (r *familyReader) destination(kind backends.DestinationKind, rule savedRule) (backends.Destination, bool) {
	d := backends.Destination{Kind: kind, Protocol: plan.Protocol(strings.ToUpper(rule.value("-p")))}
	switch d.Protocol {
	case plan.TCP, plan.UDP, plan.SCTP:
	default:
		return d, false
	}
	port, err := strconv.ParseUint(rule.value("--dport"), 10, 16)
	if err != nil {
		return d, false
	}
	d.Port = uint16(port)
	if kind == backends.DestNodePort {
		d.Addr = netip.IPv4Unspecified()
		if r.f == ipv6 {
			d.Addr = netip.IPv6Unspecified()
		}
		return d, true
	}
	p, err := netip.ParsePrefix(rule.value("-d"))
	if err != nil || !p.IsSingleIP() || !r.f.has(p.Addr()) {
		return d, false
	}
	d.Addr = p.Addr()
	return d, true
}

// follow returns what chain does with the new connections to d entering
// it, once per chain.
func (r *familyReader) follow(chain string, d backends.Destination) followed {
	if fl, ok := r.followed[chain]; ok {
		return fl
	}
	r.used[chain] = true
	var fl followed
	switch {
	case !r.nat.has(chain):
		r.anomaly("%s jumps to nat chain %s, which is missing", d, chain)
	case strings.HasPrefix(chain, prefixEXT):
		fl = r.external(chain, d)
	case strings.HasPrefix(chain, prefixFW):
		fl = r.firewalled(chain, d)
	default:
		fl = r.balance(chain, d)
	}
	r.followed[chain] = fl
	return fl
}

// balance reads a KUBE-SVC or KUBE-SVL chain: affinity rules, then the
// statistic rules choosing a KUBE-SEP chain each, the last unconditional.
func (r *familyReader) balance(chain string, d backends.Destination) followed {
	shares := map[netip.AddrPort]float64{}
	var affinity uint32
	mass, done := 1.0, false
	for _, rule := range r.nat.chains[chain] {
		t := rule.target()
		switch {
		case t == kubeMarkMasq || t == "MARK":
		case !strings.HasPrefix(t, prefixSEP):
			r.anomaly("nat chain %s (for %s) has a rule Weir does not write: %s", chain, d, rule)
		case rule.flag("--rcheck"):
			secs, err := strconv.ParseUint(rule.value("--seconds"), 10, 32)
			if err != nil || (affinity != 0 && uint32(secs) != affinity) {
				r.anomaly("nat chain %s (for %s) has affinity rules with different or no timeouts", chain, d)
			}
			affinity = uint32(secs)
			r.used[t] = true
		case done:
			r.anomaly("nat chain %s (for %s) has rules after its last endpoint that no connection reaches", chain, d)
		default:
			share := mass
			if p := rule.value("--probability"); p != "" {
				prob, err := strconv.ParseFloat(p, 64)
				if err != nil || prob < 0 || prob > 1 {
					r.anomaly("nat chain %s (for %s) has a bad probability %q", chain, d, p)
					continue
				}
				share = mass * prob
			} else if rule.conditional() {
				r.anomaly("nat chain %s (for %s) picks an endpoint with a condition Weir does not write: %s", chain, d, rule)
				continue
			}
			mass -= share
			done = rule.value("--probability") == ""
			if ep, ok := r.endpoint(t, affinity > 0, d); ok && share > 0 {
				shares[ep] += share
			}
		}
	}
	if len(shares) == 0 {
		r.anomaly("nat chain %s (for %s) has no rule choosing an endpoint", chain, d)
		return followed{}
	}
	if !done && mass > 1e-6 {
		r.anomaly("nat chain %s (for %s) leaves %.2g of new connections without an endpoint", chain, d, mass)
	}
	return followed{fw: backends.Forwarding{Verdict: backends.VerdictForward, Endpoints: relativeWeights(shares), AffinitySeconds: affinity}, forwards: true}
}

// endpoint reads a KUBE-SEP chain: its DNAT rule's destination, which with
// affinity must also record the client.
func (r *familyReader) endpoint(sep string, affinity bool, d backends.Destination) (netip.AddrPort, bool) {
	r.used[sep] = true
	if !r.nat.has(sep) {
		r.anomaly("%s jumps to nat chain %s, which is missing", d, sep)
		return netip.AddrPort{}, false
	}
	for _, rule := range r.nat.chains[sep] {
		if rule.target() != "DNAT" {
			continue
		}
		ep, err := netip.ParseAddrPort(rule.value("--to-destination"))
		if err != nil || !r.f.has(ep.Addr()) {
			r.anomaly("nat chain %s (for %s) translates to %q, not one address and port", sep, d, rule.value("--to-destination"))
			return netip.AddrPort{}, false
		}
		if affinity && (!rule.flag("--set") || rule.value("--name") != sep) {
			r.anomaly("nat chain %s (for %s) does not record clients for session affinity", sep, d)
		}
		return ep, true
	}
	r.anomaly("nat chain %s (for %s) has no DNAT rule", sep, d)
	return netip.AddrPort{}, false
}

// external reads a KUBE-EXT chain: masquerading, the short circuit of
// the node's own and its pods' traffic to KUBE-SVC (Local policy), then
// the unconditional jump to the chain choosing the endpoint (none when a
// Local-policy service has no local endpoint).
func (r *familyReader) external(chain string, d backends.Destination) followed {
	var fl followed
	for _, rule := range r.nat.chains[chain] {
		t := rule.target()
		switch {
		case t == kubeMarkMasq:
		case !strings.HasPrefix(t, prefixSVC) && !strings.HasPrefix(t, prefixSVL):
			r.anomaly("nat chain %s (for %s) has a rule Weir does not write: %s", chain, d, rule)
		case rule.value("--src-type") == "LOCAL":
			if sc := r.follow(t, d); sc.forwards {
				fl.fw.ShortCircuit = sc.fw.Endpoints
			}
		case rule.conditional():
			r.follow(t, d) // pods' traffic, short-circuited too
		case fl.forwards:
			r.anomaly("nat chain %s (for %s) has rules after its last endpoint that no connection reaches", chain, d)
		default:
			main := r.follow(t, d)
			fl.forwards = main.forwards
			if main.forwards {
				fl.fw.Verdict, fl.fw.Endpoints, fl.fw.AffinitySeconds = backends.VerdictForward, main.fw.Endpoints, main.fw.AffinitySeconds
			}
		}
	}
	return fl
}

// firewalled reads a KUBE-FW chain: the allowed source ranges go on to
// KUBE-EXT; the rest leaves the chain for filter KUBE-PROXY-FIREWALL to
// drop. A rule letting traffic through by anything but its source range
// (the node's own by --src-type LOCAL, as Weir wrote before it checked the
// node too) is an anomaly.
func (r *familyReader) firewalled(chain string, d backends.Destination) followed {
	var fl followed
	ranges := []netip.Prefix{}
	ext := ""
	for _, rule := range r.nat.chains[chain] {
		t := rule.target()
		switch {
		case t == "":
		case !strings.HasPrefix(t, prefixEXT) || (ext != "" && t != ext):
			r.anomaly("nat chain %s (for %s) has a rule Weir does not write: %s", chain, d, rule)
		default:
			ext = t
			p, err := netip.ParsePrefix(rule.value("-s"))
			if err != nil {
				r.anomaly("nat chain %s (for %s) lets traffic through without a source range: %s", chain, d, rule)
				continue
			}
			ranges = append(ranges, p.Masked())
		}
	}
	if ext != "" {
		fl = r.follow(ext, d)
	}
	fl.fw.Allowed = ranges
	return fl
}

// filterVerdicts reads the rejects and drops of destinations without
// endpoints for their traffic: filter KUBE-SERVICES (cluster IPs) and
// KUBE-EXTERNAL-SERVICES (external IPs; node ports on local addresses).
func (r *familyReader) filterVerdicts(pending map[backends.Destination]bool) {
	for _, chain := range []string{kubeServices, kubeExternalServices} {
		for _, rule := range r.filter.chains[chain] {
			kind := backends.DestCluster
			switch {
			case chain == kubeExternalServices && rule.value("--dst-type") == "LOCAL":
				kind = backends.DestNodePort
			case chain == kubeExternalServices:
				kind = backends.DestExternal
			}
			verdict := map[string]backends.Verdict{"REJECT": backends.VerdictReject, "DROP": backends.VerdictDrop}[rule.target()]
			d, ok := r.destination(kind, rule)
			if verdict == 0 || !ok {
				r.anomaly("filter chain %s has a rule Weir does not write: %s", chain, rule)
				continue
			}
			if kind == backends.DestNodePort && !r.nodePorts {
				continue
			}
			r.filterVerdict(d, verdict, pending)
		}
	}
}

// filterVerdict records that d is rejected or dropped.
func (r *familyReader) filterVerdict(d backends.Destination, verdict backends.Verdict, pending map[backends.Destination]bool) {
	fw, ok := r.v.Destinations[d]
	switch {
	case !ok:
		r.v.Destinations[d] = backends.Forwarding{Verdict: verdict}
	case pending[d]:
		fw.Verdict = verdict
		r.v.Destinations[d] = fw
		delete(pending, d)
	default:
		r.anomaly("%s is forwarded in nat and also has a %s rule in filter", d, verdict)
	}
}

// firewall reads filter KUBE-PROXY-FIREWALL: the drop of each
// load-balancer IP with source ranges, preceded, when the IP has no nat
// chain, by the RETURN of the allowed ranges.
func (r *familyReader) firewall() {
	allowed := map[backends.Destination][]netip.Prefix{}
	for _, rule := range r.filter.chains[kubeProxyFirewall] {
		if isLocalnetDrop(rule) {
			continue
		}
		d, ok := r.destination(backends.DestExternal, rule)
		t := rule.target()
		switch {
		case !ok || (t != "RETURN" && t != "DROP"):
			r.anomaly("filter chain %s has a rule Weir does not write: %s", kubeProxyFirewall, rule)
		case t == "RETURN":
			p, err := netip.ParsePrefix(rule.value("-s"))
			if err != nil {
				r.anomaly("filter chain %s lets traffic through without a source range: %s", kubeProxyFirewall, rule)
				continue
			}
			allowed[d] = append(allowed[d], p.Masked())
		default:
			r.firewallDrop(d, allowed[d])
		}
	}
	for d, fw := range r.v.Destinations {
		if r.f.has(d.Addr) && fw.Allowed != nil && !r.dropped[d] {
			r.anomaly("%s lets connections from outside its source ranges through: filter %s does not drop them", d, kubeProxyFirewall)
		}
	}
}

// firewallDrop records the drop of d's connections from outside allowed,
// the source ranges filter lets through first; when d has no nat chain,
// these are its source ranges.
func (r *familyReader) firewallDrop(d backends.Destination, allowed []netip.Prefix) {
	r.dropped[d] = true
	fw, ok := r.v.Destinations[d]
	if !ok {
		r.anomaly("filter chain %s drops %s, which nothing else serves", kubeProxyFirewall, d)
		return
	}
	if fw.Allowed == nil {
		fw.Allowed = append([]netip.Prefix{}, allowed...)
		r.v.Destinations[d] = fw
	}
}

// isLocalnetDrop says whether rule is the drop of packets to 127.0.0.0/8
// from elsewhere that localhostNodePorts adds.
func isLocalnetDrop(rule savedRule) bool {
	return rule.value("-d") == "127.0.0.0/8" && rule.target() == "DROP"
}

// maxWeightSum is the largest sum of weights relativeWeights tries to
// recover exactly.
const maxWeightSum = 1000

// relativeWeights turns the endpoints' shares of new connections back into
// small whole weights: the smallest sum of weights up to maxWeightSum that
// gives every share within the kernel's precision (a probability is kept
// in 31 bits: each rule's error is below 2.3e-10, and the errors add up
// along the chain); otherwise shares in millionths.
func relativeWeights(shares map[netip.AddrPort]float64) map[netip.AddrPort]uint32 {
	var total float64
	for _, s := range shares {
		total += s
	}
	out := make(map[netip.AddrPort]uint32, len(shares))
	for sum := len(shares); sum <= maxWeightSum; sum++ {
		whole := true
		tolerance := 1e-6 + float64(len(shares)*sum)*5e-10
		for ep, s := range shares {
			x := s / total * float64(sum)
			w := math.Round(x)
			if w < 1 || math.Abs(x-w) > tolerance {
				whole = false
				break
			}
			out[ep] = uint32(w)
		}
		if whole {
			return out
		}
	}
	for ep, s := range shares {
		out[ep] = uint32(max(1, math.Round(s/total*1e6)))
	}
	return out
}
