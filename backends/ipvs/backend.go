// Package ipvs programs Weir's plan into the kernel's IP Virtual Server
// over generic netlink. Syncs go through a small client of our own
// (genl.go) that pipelines: many acknowledged requests per write, many
// acknowledgements per read; github.com/moby/ipvs, one round trip per
// call, serves the graceful-termination loop.
//
// Every cluster, external and load-balancer IP sits as a host address on a
// dummy interface (default "weir-ipvs0"), so the node accepts its packets;
// each of those addresses, and each node-port address, gets one NAT
// virtual server per service port whose real servers are the plan's
// endpoints for that traffic, with the plan's weights.
//
// The backend remembers what it programmed. A partial sync sends only the
// changes of the changed services and reads nothing back; a full sync
// reads Weir's virtual servers, the interface's addresses and the ipsets
// back from the kernel, removes strays, repairs drift, recreates what was
// removed (the interface, an address, a set, a chain, a jump) and
// replaces a set of the wrong type.
// IPVS has no transactions: a failed sync may leave part of its changes
// applied, so Sync follows it at once with a full sync, which converges
// from whatever the kernel holds.
//
// ReadBack (readback.go) reads the whole layer back from the kernel alone
// for weir verify and the soak checker: never on the sync path.
//
// A TCP real server that is no longer wanted is first set to weight 0 and
// deleted once the kernel counts no connections for it, or after
// Options.GracePeriod; a background loop checks every second while any
// real server drains.
//
// An iptables layer, as in kube-proxy's IPVS mode but under Weir's own
// names, does what IPVS cannot. Per family, ipsets describe the
// destinations: WEIR-IPVS-CLUSTER-IP (cluster IP,proto:port),
// WEIR-IPVS-EXTERNAL (every other destination: external and load-balancer
// IPs, node-port addresses with their node ports), WEIR-IPVS-EXTERNAL-LOCAL
// (those of externalTrafficPolicy Local services), WEIR-IPVS-HAIRPIN
// (endpoint,proto:port,endpoint), WEIR-IPVS-DROP (Local-policy
// destinations whose endpoints are all elsewhere), WEIR-IPVS-FIREWALL and
// WEIR-IPVS-SOURCE-RANGES (load-balancer destinations with
// loadBalancerSourceRanges, and the ranges they allow). They follow the
// virtual servers over netlink: a partial sync adds and deletes the
// changed services' entries, a full sync reads the sets back and
// reconciles them. At each full sync one iptables-restore --noflush per
// family rewrites the chains WEIR-IPVS-* (nat: masquerading; filter,
// from INPUT: new connections refused by source ranges or by a Local
// policy without local endpoints are dropped before IPVS sees them;
// mangle: the short circuit below), and go-iptables adds any missing
// jump. Cluster-IP packets from sources the local traffic detector does
// not take for pods (all with MasqueradeAll, none without detector
// information), packets to other destinations unless their service is
// Local, the node's own connections from a service address, and hairpin
// packets get the 0x4000 mark and are masqueraded in POSTROUTING, like
// the other backends. The iptables flavour is the one the node already
// uses (backends/internal/xtables, as in mode iptables), or
// Options.Flavour.
//
// The short circuit (shortcircuit.go): connections the node or its pods
// open to a Local service's external addresses reach all its cluster
// endpoints, as in kube-proxy's iptables and nftables modes, through
// one firewall-mark virtual server per service and family and one mangle
// rule per external destination; those rules are rewritten (mangle table
// only) at a partial sync that changes them.
//
// IPv6 service addresses are deprecated on the interface, so that source
// selection never picks them for other destinations. Node ports are not
// served on loopback addresses (localhostNodePorts does not apply), as in
// kube-proxy's IPVS mode.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/sdk/plan"
)

// Backend is the IPVS backend. It is safe for one caller at a time; its
// background graceful-termination loop takes the same lock.
type Backend struct {
	mu   sync.Mutex
	opts Options
	log  *slog.Logger
	ipvs ipvsConn
	// genl pipelines the syncs' changes and read-back; ipvs serves the
	// graceful-termination loop.
	genl *genlConn
	nl   *netlink.Handle
	sets *setConn
	now  func() time.Time
	masq *masqLayer

	// synced is false until a sync succeeds and after any sync fails: the
	// next sync is then full.
	synced bool
	// programmed is what the backend believes the kernel holds, for every
	// virtual server it manages.
	programmed map[vsKey]*virtualServer
	// services is the state last applied for each plan service, and owner
	// the service each virtual server belongs to.
	services map[plan.Key]*serviceState
	owner    map[vsKey]plan.Key
	// marks are the short-circuit marks of the services.
	marks *marks
	// addrRefs counts the services using each address on the interface.
	addrRefs map[netip.Addr]int
	// nodePorts are the addresses node ports use; nodeAddrs the plan
	// node's addresses they were picked with.
	nodePorts []netip.Addr
	nodeAddrs []netip.Addr

	stop, done chan struct{}
}

// New returns a backend for the network namespace in opts, after checking
// opts. It starts the graceful-termination loop; Close stops it.
func New(opts Options) (*Backend, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	nl, err := netlinkHandle(opts.NetNS)
	if err != nil {
		return nil, err
	}
	path := ""
	if opts.NetNS != 0 {
		path = fmt.Sprintf("/proc/self/fd/%d", opts.NetNS)
	}
	h, err := ipvs.New(path)
	if err != nil {
		nl.Close()
		return nil, fmt.Errorf("ipvs: open generic netlink socket: %w", err)
	}
	// ipvs.New has loaded the ip_vs module: the family resolves.
	gc, err := newGenlConn(nl, opts.NetNS)
	if err != nil {
		h.Close()
		nl.Close()
		return nil, err
	}
	sets, err := newSetConn(nl, opts.NetNS)
	if err != nil {
		gc.Close()
		h.Close()
		nl.Close()
		return nil, err
	}
	masq, err := newMasqLayer(context.Background(), opts.NetNS, sets, opts.Flavour, opts.Logger())
	if err != nil {
		sets.Close()
		gc.Close()
		h.Close()
		nl.Close()
		return nil, err
	}
	b := &Backend{opts: opts, log: opts.Logger(), ipvs: h, genl: gc, nl: nl, sets: sets, now: time.Now, masq: masq,
		stop: make(chan struct{}), done: make(chan struct{})}
	b.reset()
	go b.drainLoop(b.stop, b.done)
	return b, nil
}

func netlinkHandle(fd int) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if fd == 0 {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(vnetns.NsHandle(fd))
	}
	if err != nil {
		return nil, fmt.Errorf("ipvs: open rtnetlink socket: %w", err)
	}
	return h, nil
}

// reset forgets everything programmed.
func (b *Backend) reset() {
	b.synced = false
	b.programmed = map[vsKey]*virtualServer{}
	b.services = map[plan.Key]*serviceState{}
	b.owner = map[vsKey]plan.Key{}
	b.marks = newMarks()
	b.addrRefs = map[netip.Addr]int{}
	b.nodePorts, b.nodeAddrs = nil, nil
}

// Sync makes the kernel match p; see backends.Backend. When the sync
// fails, because something was removed or changed behind Weir's back or
// the kernel refused a change, Sync rebuilds at once with a full sync
// (which reads everything back and recreates what is missing) and returns
// only that one's error; not when another process held the xtables lock,
// which a rebuild would wait for again. After a failed Sync the next one
// is full.
func (b *Backend) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	full := req.Full || !b.synced || b.nodeChanged(p)
	var err error
	if full {
		err = b.fullSync(ctx, p)
	} else {
		err = b.partialSync(ctx, p, req.Changed)
	}
	var locked *xtables.LockError
	if err != nil && ctx.Err() == nil && !errors.As(err, &locked) {
		kind := map[bool]string{false: "partial", true: "full"}[full]
		b.log.Warn("IPVS "+kind+" sync failed; rebuilding from what the kernel holds now", "error", err)
		if err = b.fullSync(ctx, p); err == nil {
			b.log.Info("IPVS rules rebuilt after a failed sync", "services", len(p.Services))
		}
	}
	b.synced = err == nil
	return err
}

// Cleanup removes every virtual server on an address of Weir's interface
// or on a node-port address, the masquerade rules and ipsets, and the
// interface; then what RemoveKubeProxy removes. Without a successful sync
// since New, the node-port addresses are the local addresses inside
// NodePortCIDRs, or all of them.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ours, link, err := b.cleanupScope()
	if err != nil {
		return err
	}
	if err := b.deleteServers(ours); err != nil {
		return err
	}
	if err := b.masq.cleanup(b.opts.NetNS); err != nil {
		return err
	}
	if link != nil {
		if err := b.nl.LinkDel(link); err != nil {
			return fmt.Errorf("ipvs: delete interface %s: %w", b.opts.Interface, err)
		}
	}
	err = b.removeKubeProxy()
	b.reset()
	return err
}

// deleteServers deletes every virtual server of the kernel that scope
// holds, in one batch.
func (b *Backend) deleteServers(scope func(vsKey) bool) error {
	kernel, err := readKernel(b.genl, scope)
	if err != nil {
		return err
	}
	var dels []op
	for _, k := range slices.SortedFunc(maps.Keys(kernel), vsKey.compare) {
		dels = append(dels, op{kind: opDelVS, key: k})
	}
	return applyBatch(b.genl, kernel, dels, b.now())
}

// Close stops the graceful-termination loop and releases the sockets.
// Draining real servers stay at weight 0.
func (b *Backend) Close() error {
	close(b.stop)
	<-b.done
	b.ipvs.Close()
	b.genl.Close()
	b.sets.Close()
	b.nl.Close()
	return nil
}
