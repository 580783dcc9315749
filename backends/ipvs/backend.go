// Package ipvs programs Weir's plan into the kernel's IP Virtual Server:
// one NAT virtual server per service address and port (cluster, external
// and load-balancer IPs on the dummy interface "weir-ipvs0", node-port
// addresses on their node ports) whose real servers are the plan's
// endpoints with their weights, plus the iptables and ipset layer that
// does what IPVS cannot (masquerading, source ranges, Local-policy drops,
// the short circuit of node traffic to Local services), under Weir's own
// WEIR-IPVS-* names.
//
// Syncs use a pipelining generic netlink client of this package (genl.go);
// github.com/moby/ipvs supplies the message types and loads the ip_vs
// module. IPVS has no transactions, so a failed sync is followed at once by
// a full sync, which reads Weir's virtual servers, addresses and sets back
// and converges from whatever the kernel holds. docs/architecture.md
// describes the files, docs/semantics.md where each Service feature lives.
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
	// genl carries every sync, read-back and graceful termination; ipvs,
	// moby/ipvs's handle, only loaded the ip_vs module when it opened (the
	// VM kernel tests also use it to change IPVS behind the backend's back).
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
	// the service each virtual server belongs to. services is written
	// under view as well as mu, and a state in it is replaced, never
	// changed: Signals reads it under view alone.
	services map[plan.Key]*serviceState
	owner    map[vsKey]plan.Key
	view     sync.RWMutex
	// signals is Signals' own socket and counters.
	signals signalReader
	// marks are the short-circuit marks of the services.
	marks *marks
	// addrRefs counts the services using each address on the interface.
	addrRefs map[netip.Addr]int
	// nodePorts are the addresses node ports use; nodeAddrs the plan
	// node's addresses they were picked with.
	nodePorts []netip.Addr
	nodeAddrs []netip.Addr
	// nodeIPs are the node's IPs (IPv4, IPv6) the source-range entries
	// were computed with, and ranged the services whose entries depend on
	// them (serviceState.ranged): a new node IP syncs only those.
	nodeIPs [2]netip.Addr
	ranged  map[plan.Key]bool

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
	b.setServices(map[plan.Key]*serviceState{})
	b.owner = map[vsKey]plan.Key{}
	b.marks = newMarks()
	b.addrRefs = map[netip.Addr]int{}
	b.nodePorts, b.nodeAddrs = nil, nil
	b.nodeIPs = [2]netip.Addr{}
}

// setServices replaces the state of every service.
func (b *Backend) setServices(s map[plan.Key]*serviceState) {
	b.ranged = map[plan.Key]bool{}
	for k, st := range s {
		if st.ranged {
			b.ranged[k] = true
		}
	}
	b.view.Lock()
	b.services = s
	b.view.Unlock()
}

// setService replaces the state of one service (nil: it has none).
func (b *Backend) setService(key plan.Key, st *serviceState) {
	if st != nil && st.ranged {
		b.ranged[key] = true
	} else {
		delete(b.ranged, key)
	}
	b.view.Lock()
	defer b.view.Unlock()
	if st == nil {
		delete(b.services, key)
	} else {
		b.services[key] = st
	}
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
	if _, err := b.deleteServers(ours); err != nil {
		return err
	}
	if _, _, err := b.masq.cleanup(b.opts.NetNS); err != nil {
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
// holds, in one batch, and returns their keys.
func (b *Backend) deleteServers(scope func(vsKey) bool) ([]vsKey, error) {
	kernel, err := readKernel(b.genl, scope)
	if err != nil {
		return nil, err
	}
	keys := slices.SortedFunc(maps.Keys(kernel), vsKey.compare)
	var dels []op
	for _, k := range keys {
		dels = append(dels, op{kind: opDelVS, key: k})
	}
	if err := applyBatch(b.genl, kernel, dels, b.now()); err != nil {
		return nil, err
	}
	return keys, nil
}

// Flavour returns the iptables flavour of the masquerade layer ("legacy"
// or "nft"), resolved from Options.Flavour.
func (b *Backend) Flavour() string { return b.masq.flavour }

// Close stops the graceful-termination loop and releases the sockets.
// Draining real servers stay at weight 0.
func (b *Backend) Close() error {
	close(b.stop)
	<-b.done
	b.signals.close()
	b.ipvs.Close()
	b.genl.Close()
	b.sets.Close()
	b.nl.Close()
	return nil
}
