package backends

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/sdk/plan"
)

// Reader is a backend that can read back from the kernel how it forwards
// new connections to each destination it serves. It is a capability for
// checking (weir verify, weir diagnose, the soak checker) and never used on
// the sync path.
type Reader interface {
	// ReadBack reads the kernel's rules, independently of what the backend
	// remembers committing.
	ReadBack(ctx context.Context) (*View, error)
	// Expected returns the view ReadBack must return once p is committed,
	// and the service owning each destination: Expect with the options
	// of this backend.
	Expected(p *plan.Plan) (*View, map[Destination]plan.Key)
}

// View is what the kernel does with new connections to every destination
// that Weir's rules serve, in a form every backend can be read back into
// and a plan can be turned into (see Expect).
type View struct {
	Destinations map[Destination]Forwarding
	// Anomalies are inconsistencies the reader found that no destination
	// shows: a map or chain missing, an element pointing nowhere, objects
	// Weir did not write in its own table.
	Anomalies []string
}

// DestinationKind says how a destination is reached.
type DestinationKind uint8

// The kinds of destination.
const (
	// DestCluster is a cluster IP and port.
	DestCluster DestinationKind = iota + 1
	// DestExternal is an external IP or a load-balancer IP and port.
	DestExternal
	// DestNodePort is a node port on the node's addresses; its Addr is the
	// unspecified address of the family served (0.0.0.0 or ::).
	DestNodePort
)

var kindNames = [...]string{DestCluster: "cluster IP", DestExternal: "external IP", DestNodePort: "node port"}

// Destination is one address, protocol and port a service is reached at.
type Destination struct {
	Kind     DestinationKind
	Addr     netip.Addr
	Protocol plan.Protocol
	Port     uint16
}

// String formats the destination as "cluster IP 10.96.0.10:53/UDP".
func (d Destination) String() string {
	name := "unknown"
	if int(d.Kind) < len(kindNames) && kindNames[d.Kind] != "" {
		name = kindNames[d.Kind]
	}
	return fmt.Sprintf("%s %s/%s", name, netip.AddrPortFrom(d.Addr, d.Port), d.Protocol)
}

// Verdict is what happens to a new connection to a destination.
type Verdict uint8

// The verdicts.
const (
	// VerdictForward translates the connection to one of the endpoints.
	VerdictForward Verdict = iota + 1
	// VerdictReject refuses it at once: the service has no endpoint at all.
	VerdictReject
	// VerdictDrop drops it: the service has endpoints, none for this traffic.
	VerdictDrop
)

var verdictNames = [...]string{VerdictForward: "forward", VerdictReject: "reject", VerdictDrop: "drop"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) && verdictNames[v] != "" {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", v)
}

// Forwarding is what the kernel does with new connections to one
// destination.
type Forwarding struct {
	Verdict Verdict
	// Endpoints maps each endpoint that new connections reach to its
	// relative weight; only with VerdictForward. Endpoints of weight 0
	// are left out.
	Endpoints map[netip.AddrPort]uint32
	// AffinitySeconds is the ClientIP affinity timeout; 0 for none.
	AffinitySeconds uint32
	// ShortCircuit, for the external and node-port destinations of an
	// externalTrafficPolicy: Local service, maps the endpoints that
	// connections from this node and its pods reach (the cluster's) to
	// their relative weights; nil when such connections are treated like
	// any other.
	ShortCircuit map[netip.AddrPort]uint32
	// Allowed are the source ranges allowed to reach a load-balancer IP
	// (loadBalancerSourceRanges, and the sources NodeSources adds when one
	// holds the node's IP); nil allows everyone.
	Allowed []netip.Prefix
}

// ExpectOptions says which destinations a backend serves.
type ExpectOptions struct {
	// NodePortFamilies are the families whose node ports the backend
	// serves, 4 and/or 6; nodePortAddresses may leave one out.
	NodePortFamilies []int
}

// Expect returns the view a backend that committed p must read back, and
// the service that owns each destination.
func Expect(p *plan.Plan, opts ExpectOptions) (*View, map[Destination]plan.Key) {
	v := &View{Destinations: map[Destination]Forwarding{}}
	owners := map[Destination]plan.Key{}
	for _, k := range p.Keys() {
		for _, fam := range []int{4, 6} {
			expectService(v, owners, p.Services[k], NodeIP(p.Node, fam == 6), slices.Contains(opts.NodePortFamilies, fam))
		}
	}
	return v, owners
}

// expectService adds the destinations of one service in the family of
// nodeIP, the node's IP there (NodeIP).
func expectService(v *View, owners map[Destination]plan.Key, s *plan.Service, nodeIP netip.Addr, nodePorts bool) {
	fam := 4
	if nodeIP.Is6() {
		fam = 6
	}
	in := func(a netip.Addr) bool { return (fam == 4) == a.Unmap().Is4() }
	var eps []plan.Endpoint
	for _, e := range s.Endpoints {
		if in(e.Address) {
			eps = append(eps, e)
		}
	}
	var affinity uint32
	if s.Affinity != nil {
		affinity = max(s.Affinity.TimeoutSeconds, 1)
	}
	cluster := forwarding(eps, s.InternalLocal, affinity)
	external := forwarding(eps, s.ExternalLocal, affinity)
	// The node's and the pods' own traffic to a Local policy's external
	// addresses reaches the cluster's endpoints, whatever the internal policy.
	if all := forwarding(eps, false, affinity); s.ExternalLocal && all.Verdict == VerdictForward {
		external.ShortCircuit = all.Endpoints
	}
	add := func(d Destination, f Forwarding) {
		v.Destinations[d] = f
		owners[d] = s.Key
	}
	for _, a := range distinct(s.ClusterIPs, in) {
		add(Destination{DestCluster, a, s.Key.Protocol, s.Port}, cluster)
	}
	ranges := prefixesIn(append(slices.Clone(s.SourceRanges), NodeSources(s, nodeIP)...), fam)
	for _, a := range distinct(append(slices.Clone(s.ExternalIPs), s.LoadBalancerIPs...), in) {
		f := external
		if len(s.SourceRanges) > 0 && slices.Contains(s.LoadBalancerIPs, a) {
			f.Allowed = ranges
			if f.Allowed == nil {
				f.Allowed = []netip.Prefix{} // ranges of the other family only: nobody
			}
		}
		add(Destination{DestExternal, a, s.Key.Protocol, s.Port}, f)
	}
	if s.NodePort != 0 && nodePorts {
		any := netip.IPv4Unspecified()
		if fam == 6 {
			any = netip.IPv6Unspecified()
		}
		add(Destination{DestNodePort, any, s.Key.Protocol, s.NodePort}, external)
	}
}

// forwarding is the forwarding of one traffic policy over eps (one
// family's endpoints): the Local or the Cluster set of endpoints of
// non-zero weight; a drop when none is left but eps is not empty.
func forwarding(eps []plan.Endpoint, local bool, affinity uint32) Forwarding {
	w := map[netip.AddrPort]uint32{}
	for _, e := range eps {
		if e.Weight > 0 && ((local && e.ForLocal) || (!local && e.ForCluster)) {
			w[e.AddrPort()] += e.Weight
		}
	}
	switch {
	case len(w) > 0:
		return Forwarding{Verdict: VerdictForward, Endpoints: w, AffinitySeconds: affinity}
	case len(eps) > 0:
		return Forwarding{Verdict: VerdictDrop}
	}
	return Forwarding{Verdict: VerdictReject}
}

func distinct(addrs []netip.Addr, in func(netip.Addr) bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if in(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func prefixesIn(ps []netip.Prefix, fam int) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if (fam == 4) == p.Addr().Unmap().Is4() && !slices.Contains(out, p.Masked()) {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Divergence is one difference between the view a plan expects and the
// one read back from the kernel.
type Divergence struct {
	// Service owns the destination in the plan; empty for a destination
	// the plan does not have, or an anomaly.
	Service plan.Key
	// Destination is the zero value for an anomaly.
	Destination Destination
	// Field is "destination", "verdict", "endpoints", "affinity",
	// "short-circuit", "source ranges" or "anomaly".
	Field     string
	Want, Got string
}

// String formats the divergence for a log line or a report.
func (d Divergence) String() string {
	if d.Field == "anomaly" {
		return "anomaly: " + d.Got
	}
	owner := "no service"
	if d.Service != (plan.Key{}) {
		owner = d.Service.String()
	}
	return fmt.Sprintf("%s (%s): %s: want %s, got %s", owner, d.Destination, d.Field, d.Want, d.Got)
}

// shareTolerance is how far an endpoint's share of new connections may be
// from the plan's: backends approximate weights (nftables caps a pool at
// 4096 buckets, iptables writes probabilities with ten decimals).
const shareTolerance = 0.005

// Compare returns every difference between want (from Expect, with its
// owners) and got (read back), ordered by destination.
func Compare(want *View, owners map[Destination]plan.Key, got *View) []Divergence {
	var out []Divergence
	dests := slices.Collect(maps.Keys(want.Destinations))
	for d := range got.Destinations {
		if _, ok := want.Destinations[d]; !ok {
			dests = append(dests, d)
		}
	}
	slices.SortFunc(dests, compareDestination)
	for _, d := range dests {
		w, inWant := want.Destinations[d]
		g, inGot := got.Destinations[d]
		div := Divergence{Service: owners[d], Destination: d, Field: "destination"}
		switch {
		case !inGot:
			div.Want, div.Got = "present ("+w.Verdict.String()+")", "missing"
			out = append(out, div)
		case !inWant:
			div.Want, div.Got = "absent", "present ("+g.Verdict.String()+")"
			out = append(out, div)
		default:
			out = append(out, compareForwarding(div, w, g)...)
		}
	}
	for _, a := range got.Anomalies {
		out = append(out, Divergence{Field: "anomaly", Got: a})
	}
	return out
}

func compareForwarding(div Divergence, w, g Forwarding) []Divergence {
	var out []Divergence
	field := func(name, want, got string) {
		if want != got {
			d := div
			d.Field, d.Want, d.Got = name, want, got
			out = append(out, d)
		}
	}
	field("verdict", w.Verdict.String(), g.Verdict.String())
	if !sameShares(w.Endpoints, g.Endpoints) {
		field("endpoints", formatWeights(w.Endpoints), formatWeights(g.Endpoints))
	}
	field("affinity", fmt.Sprint(w.AffinitySeconds), fmt.Sprint(g.AffinitySeconds))
	if !sameShares(w.ShortCircuit, g.ShortCircuit) || (w.ShortCircuit == nil) != (g.ShortCircuit == nil) {
		field("short-circuit", formatWeights(w.ShortCircuit), formatWeights(g.ShortCircuit))
	}
	field("source ranges", formatRanges(covering(w.Allowed)), formatRanges(covering(g.Allowed)))
	return out
}

// covering returns the ranges no other range of r covers: the same
// sources, as a backend whose kernel refuses overlapping ranges writes
// them (nil stays nil).
func covering(r []netip.Prefix) []netip.Prefix {
	if r == nil {
		return nil
	}
	out := []netip.Prefix{}
	for i, p := range r {
		inside := slices.ContainsFunc(r, func(q netip.Prefix) bool { return q.Bits() < p.Bits() && q.Contains(p.Addr()) })
		if !inside && !slices.Contains(r[:i], p) {
			out = append(out, p)
		}
	}
	return out
}

// sameShares reports whether two weight maps name the same endpoints with
// the same shares of new connections, within shareTolerance.
func sameShares(a, b map[netip.AddrPort]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	sa, sb := sum(a), sum(b)
	for ep, wa := range a {
		wb, ok := b[ep]
		if !ok {
			return false
		}
		if d := float64(wa)/float64(sa) - float64(wb)/float64(sb); d > shareTolerance || d < -shareTolerance {
			return false
		}
	}
	return true
}

func sum(m map[netip.AddrPort]uint32) uint64 {
	var n uint64
	for _, w := range m {
		n += uint64(w)
	}
	return n
}

// formatWeights lists endpoints with their weights in address order:
// "10.0.0.1:80*1 10.0.0.2:80*3"; "none" when empty.
func formatWeights(m map[netip.AddrPort]uint32) string {
	if len(m) == 0 {
		return "none"
	}
	eps := slices.SortedFunc(maps.Keys(m), netip.AddrPort.Compare)
	parts := make([]string, len(eps))
	for i, ep := range eps {
		parts[i] = fmt.Sprintf("%s*%d", ep, m[ep])
	}
	return strings.Join(parts, " ")
}

// formatRanges lists source ranges in order; "everyone" for nil or a
// list holding a /0 (a backend may keep no ranges for it, allowing
// everyone), "nobody" for an empty list.
func formatRanges(r []netip.Prefix) string {
	if r == nil || slices.ContainsFunc(r, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return "everyone"
	}
	if len(r) == 0 {
		return "nobody"
	}
	s := slices.Clone(r)
	slices.SortFunc(s, comparePrefix)
	parts := make([]string, len(s))
	for i, p := range s {
		parts[i] = p.String()
	}
	return strings.Join(parts, " ")
}

func compareDestination(a, b Destination) int {
	if a.Kind != b.Kind {
		return int(a.Kind) - int(b.Kind)
	}
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Protocol != b.Protocol {
		return strings.Compare(string(a.Protocol), string(b.Protocol))
	}
	return int(a.Port) - int(b.Port)
}
