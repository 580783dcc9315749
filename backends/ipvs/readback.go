package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// The read-back (backends.Reader). ReadBack rebuilds, from the kernel
// alone, what happens to new connections to each destination Weir
// serves: the virtual servers and their real servers, the addresses on
// Weir's interface, the ipsets and the iptables rules of the layer. Which
// virtual servers are Weir's, and of which kind, is what the kernel says:
// one on an address of the interface is a cluster IP or an external one
// as WEIR-IPVS-CLUSTER-IP and WEIR-IPVS-EXTERNAL say, one on a node-port
// address (those the last sync picked; before any, the local addresses
// inside nodePortAddresses) is a node port, and firewall-mark virtual
// servers in Weir's range are short circuits. Virtual servers on other
// addresses that no set names are someone else's and left out.

// weightBlind are the schedulers that use a real server's weight only to
// tell whether it takes connections: round robin, least connection and
// destination hashing spread new connections evenly whatever the weights.
var weightBlind = []string{"rr", "lc", "dh"}

// ReadBack reads how the kernel forwards new connections to every
// destination of Weir's IPVS layer; see backends.Reader.
func (b *Backend) ReadBack(ctx context.Context) (*backends.View, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return s.view(), nil
}

// Expected returns the view ReadBack must return once p is committed;
// see backends.Reader. IPVS serves a single-stack service's node port in
// the service's own family only (as kube-proxy, whose proxier of the
// other family never sees the service): elsewhere the node's own stack
// answers, so the view leaves that destination out.
func (b *Backend) Expected(p *plan.Plan) (*backends.View, map[backends.Destination]plan.Key) {
	b.mu.Lock()
	addrs, err := b.nodePortScope()
	b.mu.Unlock()
	if err != nil {
		b.log.Warn("Cannot list the node's addresses; expecting node ports in no family", "error", err)
	}
	var fams []int
	for _, a := range addrs {
		if f := familyOf(a); !slices.Contains(fams, f) {
			fams = append(fams, f)
		}
	}
	v, owners := backends.Expect(p, backends.ExpectOptions{NodePortFamilies: fams})
	for d, key := range owners {
		if d.Kind == backends.DestNodePort && !servesFamily(p.Services[key], d.Addr) {
			delete(v.Destinations, d)
			delete(owners, d)
		}
	}
	return v, owners
}

// nodePortScope returns the addresses node ports are served on: those the
// last successful sync picked, or before one the local addresses inside
// NodePortCIDRs (all of them without).
func (b *Backend) nodePortScope() ([]netip.Addr, error) {
	if b.synced {
		return b.nodePorts, nil
	}
	skip := -1
	if l, err := b.nl.LinkByName(b.opts.Interface); err == nil {
		skip = l.Attrs().Index
	}
	local, err := localAddrs(b.nl, skip)
	if err != nil {
		return nil, err
	}
	c := b.opts.Common
	c.NodePortPrimary = false
	return nodePortAddrs(&c, plan.Node{}, local), nil
}

// snapshot is the kernel state of the layer, as read back.
type snapshot struct {
	iface string
	// onLink are the addresses on the interface; nil when it is missing.
	onLink    map[netip.Addr]bool
	nodePorts []netip.Addr
	// servers are every virtual server of the namespace (see addReals).
	servers map[vsKey]*virtualServer
	// sets are the entries of each set of the layer the kernel has.
	sets map[string]map[setEntry]bool
	// rules are the iptables layer of families 4 and 6.
	rules map[int]*familyRules
	bad   *anomalies
}

// snapshot reads the layer back from the kernel.
func (b *Backend) snapshot(ctx context.Context) (*snapshot, error) {
	s := &snapshot{iface: b.opts.Interface, bad: &anomalies{}}
	l, err := b.nl.LinkByName(b.opts.Interface)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		s.bad.add("interface "+b.opts.Interface+" is missing: the node accepts no connection to a cluster, external or load-balancer IP", "")
	case err != nil:
		return nil, fmt.Errorf("ipvs: find interface %s: %w", b.opts.Interface, err)
	default:
		addrs, err := linkAddrs(b.nl, l)
		if err != nil {
			return nil, err
		}
		s.onLink = addrSet(addrs)
		if l.Attrs().Flags&net.FlagUp == 0 {
			s.bad.add("interface "+b.opts.Interface+" is down", "")
		}
	}
	if s.nodePorts, err = b.nodePortScope(); err != nil {
		return nil, err
	}
	if s.servers, err = readKernel(b.genl, func(vsKey) bool { return true }); err != nil {
		return nil, err
	}
	if s.sets, err = readSets(b.sets, s.bad); err != nil {
		return nil, err
	}
	if s.rules, err = b.readRules(ctx, s.bad); err != nil {
		return nil, err
	}
	return s, nil
}

// destOf is the set entry naming virtual server k's destination in set.
func destOf(set string, k vsKey) setEntry {
	return setEntry{set: familySet(set, familyOf(k.addr)), addr: k.addr, proto: k.proto, port: k.port}
}

func (s *snapshot) has(e setEntry) bool { return s.sets[e.set][e] }

// view turns the snapshot into destinations and anomalies.
func (s *snapshot) view() *backends.View {
	v := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{}}
	nodePorts := map[nodePortKey]map[netip.Addr]backends.Forwarding{}
	ours := map[vsKey]bool{}
	for _, k := range slices.SortedFunc(maps.Keys(s.servers), vsKey.compare) {
		if k.mark != 0 {
			continue
		}
		kind := s.classify(k)
		if kind == 0 {
			continue
		}
		ours[k] = true
		f := s.forwarding(k)
		if kind == backends.DestNodePort {
			np := nodePortKey{familyOf(k.addr), k.proto, k.port}
			if nodePorts[np] == nil {
				nodePorts[np] = map[netip.Addr]backends.Forwarding{}
			}
			nodePorts[np][k.addr] = f
			continue
		}
		v.Destinations[backends.Destination{Kind: kind, Addr: k.addr, Protocol: k.proto, Port: k.port}] = f
	}
	for np, byAddr := range nodePorts {
		v.Destinations[np.destination()] = s.collapse(np, byAddr)
	}
	s.checkMarks()
	s.checkSets(ours)
	v.Anomalies = s.bad.lines()
	return v
}

// classify returns the kind of destination the virtual server k is, or
// 0 when it is not Weir's (or its address is not served).
func (s *snapshot) classify(k vsKey) backends.DestinationKind {
	cluster, external := s.has(destOf(setClusterIP, k)), s.has(destOf(setExternal, k))
	switch {
	case s.onLink[k.addr]:
		switch {
		case cluster && external:
			s.bad.add("virtual servers in both WEIR-IPVS-CLUSTER-IP and WEIR-IPVS-EXTERNAL (read as cluster IPs)", k.String())
		case external:
			return backends.DestExternal
		case !cluster:
			s.bad.add("virtual servers on "+s.iface+" in neither WEIR-IPVS-CLUSTER-IP nor WEIR-IPVS-EXTERNAL (read as cluster IPs; not masqueraded as their kind needs)", k.String())
		}
		return backends.DestCluster
	case slices.Contains(s.nodePorts, k.addr):
		if !external {
			s.bad.add("node-port virtual servers missing from WEIR-IPVS-EXTERNAL (not masqueraded)", k.String())
		}
		return backends.DestNodePort
	case cluster || external:
		s.bad.add("virtual servers in Weir's sets whose address is not on "+s.iface+" (the node does not accept their connections)", k.String())
	}
	return 0
}

// forwarding is what happens to a new connection to the virtual server k:
// the filter chain drops it first when k is in WEIR-IPVS-DROP, else IPVS
// sends it to a real server taking connections, or refuses it.
func (s *snapshot) forwarding(k vsKey) backends.Forwarding {
	vs := s.servers[k]
	rules := s.rules[familyOf(k.addr)]
	f := backends.Forwarding{Verdict: backends.VerdictReject}
	eps := s.endpoints(k)
	switch {
	case rules.filterOK && s.has(destOf(setDrop, k)):
		f.Verdict = backends.VerdictDrop
	case len(eps) > 0:
		f.Verdict, f.Endpoints, f.AffinitySeconds = backends.VerdictForward, eps, vs.persistence
	}
	if rules.filterOK && rules.nodeFirewallOK && s.has(destOf(setFirewall, k)) {
		f.Allowed = s.allowed(k)
	}
	f.ShortCircuit = s.shortCircuit(k)
	return f
}

// endpoints returns the real servers of k that take new connections,
// with their weights (all 1 under a scheduler that ignores weights).
func (s *snapshot) endpoints(k vsKey) map[netip.AddrPort]uint32 {
	vs := s.servers[k]
	blind := slices.Contains(weightBlind, vs.scheduler)
	out := map[netip.AddrPort]uint32{}
	for a, w := range vs.reals {
		switch {
		case w == notNAT:
			s.bad.add("real servers that do not forward by NAT (their connections do not reach them)", k.String()+" -> "+a.String())
		case w > 0 && blind:
			out[a] = 1
		case w > 0:
			out[a] = uint32(w)
		}
	}
	return out
}

// allowed returns the source ranges WEIR-IPVS-SOURCE-RANGES allows for
// k, sorted; empty (nobody) when it has none.
func (s *snapshot) allowed(k vsKey) []netip.Prefix {
	out := []netip.Prefix{}
	for e := range s.sets[familySet(setSourceRanges, familyOf(k.addr))] {
		if e.addr == k.addr && e.proto == k.proto && e.port == k.port {
			out = append(out, netip.PrefixFrom(e.addr2, int(e.bits2)))
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// shortCircuit returns the endpoints that the node's and its pods'
// connections to k reach through its firewall-mark virtual server, or nil
// when no mark rule applies to k.
func (s *snapshot) shortCircuit(k vsKey) map[netip.AddrPort]uint32 {
	rules := s.rules[familyOf(k.addr)]
	mark, ok := rules.marks[k]
	switch {
	case !ok:
		return nil
	case !rules.shortCircuitOK:
		return nil // the chain leading to the rule is broken (an anomaly already)
	case !s.has(destOf(setExternalLocal, k)):
		s.bad.add("short-circuit rules never reached (their destination is not in WEIR-IPVS-EXTERNAL-LOCAL)", k.String())
		return nil
	}
	mk := markKey(mark, familyOf(k.addr))
	if s.servers[mk] == nil {
		s.bad.add("short-circuit rules whose mark has no virtual server", fmt.Sprintf("%s -> %#x", k, mark))
		return nil
	}
	return s.endpoints(mk)
}

// nodePortKey is one node port of one family.
type nodePortKey struct {
	family int
	proto  plan.Protocol
	port   uint16
}

func (np nodePortKey) destination() backends.Destination {
	a := netip.IPv4Unspecified()
	if np.family == 6 {
		a = netip.IPv6Unspecified()
	}
	return backends.Destination{Kind: backends.DestNodePort, Addr: a, Protocol: np.proto, Port: np.port}
}

func (np nodePortKey) String() string {
	return fmt.Sprintf("node port %d/%s (IPv%d)", np.port, np.proto, np.family)
}

// collapse turns one node port's forwarding on each node-port address into
// the destination's: the first address's, with an anomaly when an
// address lacks it or forwards differently.
func (s *snapshot) collapse(np nodePortKey, byAddr map[netip.Addr]backends.Forwarding) backends.Forwarding {
	addrs := slices.SortedFunc(maps.Keys(byAddr), netip.Addr.Compare)
	first := byAddr[addrs[0]]
	var missing, differ []string
	for _, a := range s.nodePorts {
		f, ok := byAddr[a]
		switch {
		case familyOf(a) != np.family:
		case !ok:
			missing = append(missing, a.String())
		case !sameForwarding(f, first):
			differ = append(differ, a.String()+" ("+describeForwarding(f)+")")
		}
	}
	if len(missing) > 0 {
		s.bad.add(np.String()+" is not served on every node-port address", "not on "+strings.Join(missing, ", "))
	}
	if len(differ) > 0 {
		s.bad.add(fmt.Sprintf("%s forwards differently on its addresses: %s (%s), but", np, addrs[0], describeForwarding(first)), strings.Join(differ, ", "))
	}
	return first
}

// sameForwarding compares two forwardings exactly.
func sameForwarding(a, b backends.Forwarding) bool {
	return describeForwarding(a) == describeForwarding(b)
}

// describeForwarding formats a forwarding for an anomaly: verdict,
// endpoints with weights in order, affinity, short circuit and source
// ranges.
func describeForwarding(f backends.Forwarding) string {
	weights := func(m map[netip.AddrPort]uint32) string {
		var parts []string
		for _, a := range slices.SortedFunc(maps.Keys(m), netip.AddrPort.Compare) {
			parts = append(parts, fmt.Sprintf("%s*%d", a, m[a]))
		}
		return strings.Join(parts, " ")
	}
	out := f.Verdict.String()
	if len(f.Endpoints) > 0 {
		out += " " + weights(f.Endpoints)
	}
	if f.AffinitySeconds > 0 {
		out += fmt.Sprintf(" affinity %ds", f.AffinitySeconds)
	}
	if f.ShortCircuit != nil {
		out += " short circuit [" + weights(f.ShortCircuit) + "]"
	}
	if f.Allowed != nil {
		out += fmt.Sprintf(" allowed %v", f.Allowed)
	}
	return out
}

// checkMarks notes firewall-mark virtual servers of Weir's range that no
// short-circuit rule uses.
func (s *snapshot) checkMarks() {
	used := map[vsKey]bool{}
	for f, r := range s.rules {
		for _, mark := range r.marks {
			used[markKey(mark, f)] = true
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(s.servers), vsKey.compare) {
		if k.mark != 0 && !used[k] {
			s.bad.add("firewall-mark virtual servers no short-circuit rule uses", k.String())
		}
	}
}

// anomalies collects what the read-back found wrong, one line per kind of
// problem, naming the first few objects that show it.
type anomalies struct {
	order   []string
	objects map[string][]string
}

// add notes that object (may be empty) shows problem.
func (a *anomalies) add(problem, object string) {
	if a.objects == nil {
		a.objects = map[string][]string{}
	}
	if _, ok := a.objects[problem]; !ok {
		a.order = append(a.order, problem)
	}
	if object != "" && !slices.Contains(a.objects[problem], object) {
		a.objects[problem] = append(a.objects[problem], object)
	}
}

// anomalyExamples is how many objects a line names.
const anomalyExamples = 3

// lines returns one line per problem, in the order they were found.
func (a *anomalies) lines() []string {
	var out []string
	for _, p := range a.order {
		objs := a.objects[p]
		switch {
		case len(objs) == 0:
			out = append(out, p)
		case len(objs) <= anomalyExamples:
			out = append(out, p+": "+strings.Join(objs, "; "))
		default:
			out = append(out, fmt.Sprintf("%s: %s and %d more", p, strings.Join(objs[:anomalyExamples], "; "), len(objs)-anomalyExamples))
		}
	}
	return out
}

var _ backends.Reader = (*Backend)(nil)
