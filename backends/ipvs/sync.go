package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/sysctl"
	"github.com/weirproxy/weir/sdk/plan"
)

// ipvsSysctls are set on every full sync: IPVS connections keep
// conntrack entries (for the masquerade rules of phase 2), connections to
// deleted real servers and affinity templates pointing at weight-0 ones
// expire, and the node forwards.
var ipvsSysctls = [][2]string{
	{"net/ipv4/vs/conntrack", "1"},
	{"net/ipv4/vs/expire_nodest_conn", "1"},
	{"net/ipv4/vs/expire_quiescent_template", "1"},
	{"net/ipv4/ip_forward", "1"},
}

// strictARPSysctls keep the node from answering ARP for the addresses on
// the dummy interface.
var strictARPSysctls = [][2]string{
	{"net/ipv4/conf/all/arp_ignore", "1"},
	{"net/ipv4/conf/all/arp_announce", "2"},
}

func (b *Backend) setSysctls() error {
	list := ipvsSysctls
	if b.opts.StrictARP {
		list = slices.Concat(list, strictARPSysctls)
	}
	for _, kv := range list {
		if err := sysctl.Set(b.opts.NetNS, kv[0], kv[1]); err != nil {
			return fmt.Errorf("ipvs: %w", err)
		}
	}
	return nil
}

// nodeChanged reports whether node ports follow the plan node's addresses
// and they changed (node ports then move), or the masquerade rules
// depend on its pod CIDRs and they changed: a full sync handles both.
func (b *Backend) nodeChanged(p *plan.Plan) bool {
	return (b.opts.NodePortPrimary && !slices.Equal(p.Node.Addresses, b.nodeAddrs)) ||
		b.masq.rulesStale(&b.opts.Common, p.Node)
}

// fullSync reads Weir's virtual servers, the interface's addresses and
// the ipsets back from the kernel and turns them into the plan's, removing
// strays and repairing drift; it recreates what is missing (the interface,
// a set), replaces a set of the wrong type and rewrites the iptables
// rules. It trusts nothing it remembers about the kernel except which
// virtual servers it programmed (so that it removes them when they are no
// longer wanted): it is the from-scratch rebuild after a failed sync.
func (b *Backend) fullSync(ctx context.Context, p *plan.Plan) error {
	if err := b.setSysctls(); err != nil {
		return err
	}
	link, err := ensureDummy(b.nl, b.opts.Interface)
	if err != nil {
		return err
	}
	onLink, err := linkAddrs(b.nl, link)
	if err != nil {
		return err
	}
	local, err := localAddrs(b.nl, link.Attrs().Index)
	if err != nil {
		return err
	}
	oldNodePorts := b.nodePorts
	b.nodePorts, b.nodeAddrs = nodePortAddrs(&b.opts.Common, p.Node, local), slices.Clone(p.Node.Addresses)
	want := b.desiredAll(p)
	wantAddrs := slices.Collect(maps.Keys(b.addrRefs))
	onLinkSet := addrSet(onLink)
	nodePortSet := addrSet(b.nodePorts, oldNodePorts)
	ours := func(k vsKey) bool {
		return want[k] != nil || b.programmed[k] != nil || k.mark != 0 ||
			onLinkSet[k.addr] || b.addrRefs[k.addr] > 0 || nodePortSet[k.addr]
	}
	kernel, err := readKernel(b.genl, ours)
	if err != nil {
		return err
	}
	keepDraining(kernel, b.programmed)
	b.programmed = kernel
	var errs []error
	for _, a := range wantAddrs {
		if !onLinkSet[a] {
			errs = append(errs, addAddr(b.nl, link, a))
		}
	}
	var ops []op
	for _, k := range slices.SortedFunc(maps.Keys(unionKeys(want, kernel)), vsKey.compare) {
		ops = append(ops, diff(k, kernel[k], want[k])...)
	}
	errs = append(errs, b.applyAll(ops))
	for _, a := range onLink {
		if b.addrRefs[a] == 0 {
			errs = append(errs, delAddr(b.nl, link, a))
		}
	}
	errs = append(errs, b.masq.syncFull(ctx, &b.opts.Common, p.Node, b.services))
	return firstOf(errs)
}

// desiredAll computes every service's state, records which service owns
// each virtual server and each interface address, and returns the wanted
// virtual servers.
func (b *Backend) desiredAll(p *plan.Plan) map[vsKey]*virtualServer {
	services := map[plan.Key]*serviceState{}
	b.owner, b.addrRefs = map[vsKey]plan.Key{}, map[netip.Addr]int{}
	want := map[vsKey]*virtualServer{}
	for key := range b.marks.byKey {
		if p.Services[key] == nil {
			b.marks.release(key)
		}
	}
	for _, key := range p.Keys() {
		svc := p.Services[key]
		st := b.claim(key, desiredService(svc, b.nodePorts, b.opts.Scheduler, b.marks.forService(key, svc)))
		if st == nil {
			continue
		}
		st.entries, st.ranged = masqEntries(svc, st, p.Node), isRanged(svc)
		services[key] = st
		maps.Copy(want, st.servers)
		for _, a := range st.addrs {
			b.addrRefs[a]++
		}
	}
	b.setServices(services)
	b.nodeIPs = nodeIPsOf(p.Node)
	return want
}

// claim records key as the owner of st's virtual servers and drops from
// st those another service owns already (two services on one external IP
// and port), with their short-circuit rules: the first keeps it.
func (b *Backend) claim(key plan.Key, st *serviceState) *serviceState {
	if st == nil {
		return nil
	}
	for _, k := range st.keys() {
		if o, taken := b.owner[k]; taken && o != key {
			b.log.Warn("Virtual server already belongs to another service; ignoring it for this one",
				"virtualServer", k.String(), "service", key.String(), "owner", o.String())
			delete(st.servers, k)
			st.marks = slices.DeleteFunc(st.marks, func(r markRule) bool {
				return r.addr == k.addr && r.proto == k.proto && r.port == k.port
			})
			continue
		}
		b.owner[k] = key
	}
	return st
}

// partialSync applies the changed services' differences to what was
// programmed, reading nothing back, and rewrites the short-circuit rules
// when they changed. When the node's IP changed, the services with source
// ranges are synced too: their allowed sources depend on it.
func (b *Backend) partialSync(ctx context.Context, p *plan.Plan, changed []plan.Key) error {
	link, err := b.nl.LinkByName(b.opts.Interface)
	if err != nil {
		return fmt.Errorf("ipvs: find interface %s: %w", b.opts.Interface, err)
	}
	ips := nodeIPsOf(p.Node)
	if ips != b.nodeIPs {
		changed = append(slices.Clone(changed), slices.Collect(maps.Keys(b.ranged))...)
	}
	var errs []error
	for _, key := range uniqueKeys(changed) {
		errs = append(errs, b.syncService(link, key, p.Services[key], p.Node))
	}
	errs = append(errs, b.masq.writeMarks(ctx, &b.opts.Common, p.Node))
	err = firstOf(errs)
	if err == nil {
		b.nodeIPs = ips
	}
	return err
}

// nodeIPsOf returns the node's IPv4 and IPv6 IP as the source ranges see
// them (backends.NodeIP).
func nodeIPsOf(n plan.Node) [2]netip.Addr {
	return [2]netip.Addr{backends.NodeIP(n, false), backends.NodeIP(n, true)}
}

// isRanged reports whether svc's load-balancer IPs have source ranges:
// its set entries then depend on the node's IP.
func isRanged(svc *plan.Service) bool {
	return svc != nil && len(svc.SourceRanges) > 0 && len(svc.LoadBalancerIPs) > 0
}

// syncService moves one service from its last applied state to svc's
// (nil: deleted) on node.
func (b *Backend) syncService(link netlink.Link, key plan.Key, svc *plan.Service, node plan.Node) error {
	old := b.services[key]
	for _, k := range old.keys() {
		delete(b.owner, k)
	}
	st := b.claim(key, desiredService(svc, b.nodePorts, b.opts.Scheduler, b.marks.forService(key, svc)))
	if st != nil {
		st.entries, st.ranged = masqEntries(svc, st, node), isRanged(svc)
	}
	var errs []error
	for _, a := range addrsOf(st) {
		// Only new addresses: replacing every address of each changed
		// service would put back one removed by hand, but costs a round
		// trip per address, which the kernel makes slower the more
		// addresses the interface holds. The next full sync repairs it.
		if b.addrRefs[a]++; b.addrRefs[a] == 1 {
			errs = append(errs, addAddr(b.nl, link, a))
		}
	}
	var ops []op
	for _, k := range slices.SortedFunc(maps.Keys(unionKeys(serversOf(old), serversOf(st))), vsKey.compare) {
		ops = append(ops, diff(k, b.programmed[k], serversOf(st)[k])...)
	}
	errs = append(errs, b.applyAll(ops))
	for _, a := range addrsOf(old) {
		if b.addrRefs[a]--; b.addrRefs[a] <= 0 {
			delete(b.addrRefs, a)
			errs = append(errs, delAddr(b.nl, link, a))
		}
	}
	errs = append(errs, b.masq.syncService(old, st))
	b.setService(key, st)
	return firstOf(errs)
}

// applyAll sends ops, each virtual server's in order, in one pipeline
// (applyBatch) and records what the kernel took.
func (b *Backend) applyAll(ops []op) error {
	if b.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, o := range ops {
			b.log.Debug("IPVS change", "op", o)
		}
	}
	return applyBatch(b.genl, b.programmed, ops, b.now())
}

// cleanupScope returns which kernel virtual servers Cleanup removes, and
// Weir's interface (nil when there is none).
func (b *Backend) cleanupScope() (func(vsKey) bool, netlink.Link, error) {
	var onLink []netip.Addr
	skip := -1
	link, err := b.nl.LinkByName(b.opts.Interface)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		link = nil
	case err != nil:
		return nil, nil, fmt.Errorf("ipvs: find interface %s: %w", b.opts.Interface, err)
	default:
		if onLink, err = linkAddrs(b.nl, link); err != nil {
			return nil, nil, err
		}
		skip = link.Attrs().Index
	}
	nodePorts := b.nodePorts
	if !b.synced {
		local, err := localAddrs(b.nl, skip)
		if err != nil {
			return nil, nil, err
		}
		c := b.opts.Common
		c.NodePortPrimary = false
		nodePorts = nodePortAddrs(&c, plan.Node{}, local)
	}
	scope := addrSet(onLink, nodePorts)
	ours := func(k vsKey) bool { return b.programmed[k] != nil || k.mark != 0 || scope[k.addr] }
	return ours, link, nil
}

// addrSet returns the addresses of lists as a set.
func addrSet(lists ...[]netip.Addr) map[netip.Addr]bool {
	set := map[netip.Addr]bool{}
	for _, l := range lists {
		for _, a := range l {
			set[a] = true
		}
	}
	return set
}

// keepDraining carries the draining marks of what was programmed over to
// the virtual servers read from the kernel, for real servers still there.
func keepDraining(kernel, programmed map[vsKey]*virtualServer) {
	for k, vs := range kernel {
		old := programmed[k]
		if old == nil {
			continue
		}
		for a, since := range old.draining {
			if _, ok := vs.reals[a]; ok {
				vs.draining[a] = since
			}
		}
	}
}

func serversOf(st *serviceState) map[vsKey]*virtualServer {
	if st == nil {
		return nil
	}
	return st.servers
}

func addrsOf(st *serviceState) []netip.Addr {
	if st == nil {
		return nil
	}
	return st.addrs
}

func unionKeys(a, b map[vsKey]*virtualServer) map[vsKey]struct{} {
	out := make(map[vsKey]struct{}, len(a)+len(b))
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

func uniqueKeys(keys []plan.Key) []plan.Key {
	out := slices.Clone(keys)
	slices.SortFunc(out, plan.Key.Compare)
	return slices.Compact(out)
}

// firstOf returns the first non-nil error, noting how many more there were.
func firstOf(errs []error) error {
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("%w (and %d more errors)", first, n-1)
	}
	return first
}

var (
	_ backends.Backend          = (*Backend)(nil)
	_ backends.KubeProxyRemover = (*Backend)(nil)
)
