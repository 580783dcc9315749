// Package nftables programs Weir's plan into the kernel with nf_tables over
// netlink (github.com/google/nftables; no nft binary at run time).
//
// Everything lives in one table of family ip (default name "weir"). A full
// sync replaces the table in one atomic transaction; a partial sync sends only
// the elements of the services that changed, also as one transaction. The
// backend remembers what it committed and never reads kernel state back on
// the sync path.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// socketBuffer is the netlink socket buffer size forced for large batches.
const socketBuffer = 64 << 20

// Options configures the backend.
type Options struct {
	// Table is the nftables table name; "weir" when empty.
	Table string
	// NetNS, when non-zero, is a file descriptor of the network namespace to
	// program instead of the caller's own.
	NetNS int
	// ClusterCIDRs selects cluster-internal sources; cluster-IP traffic from
	// elsewhere is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all cluster-IP traffic.
	MasqueradeAll bool
	// LocalDetector says how pod traffic is recognised; cluster-IP traffic
	// from anything else is masqueraded. Empty means DetectClusterCIDR.
	LocalDetector LocalDetector
	// PodInterfacePrefix is the pod interface name prefix for
	// DetectInterfaceNamePrefix.
	PodInterfacePrefix string
	// NodePortCIDRs limits node ports to local addresses in these ranges;
	// empty means every local address except loopback.
	NodePortCIDRs []netip.Prefix
	// NodePortPrimary limits node ports to the plan node's addresses (the
	// Node object's InternalIP and ExternalIP), following its changes.
	NodePortPrimary bool
	// LocalhostNodePorts also accepts node ports on 127.0.0.0/8 (when
	// NodePortCIDRs is empty): the first sync sets route_localnet, and
	// packets to loopback addresses from elsewhere are dropped.
	LocalhostNodePorts bool
	// Log receives the backend's messages; slog.Default() when nil.
	Log *slog.Logger
}

// LocalDetector says how traffic from pods is recognised.
type LocalDetector string

// The ways of recognising pod traffic.
const (
	// DetectClusterCIDR: sources inside ClusterCIDRs (none when it is empty).
	DetectClusterCIDR LocalDetector = "ClusterCIDR"
	// DetectNodeCIDR: sources inside the plan node's PodCIDRs. Until the
	// node's podCIDRs are known, all cluster-IP traffic is masqueraded.
	DetectNodeCIDR LocalDetector = "NodeCIDR"
	// DetectInterfaceNamePrefix: packets arriving on an interface whose name
	// starts with PodInterfacePrefix.
	DetectInterfaceNamePrefix LocalDetector = "InterfaceNamePrefix"
)

// Backend is the nftables backend. It is safe for one caller at a time.
type Backend struct {
	mu     sync.Mutex
	conn   *nftables.Conn
	layout *layout
	state  *state
	log    *slog.Logger
	// synced is false until a full sync succeeds; partial syncs before that
	// are promoted to full ones.
	synced bool
}

// New returns a backend that programs the network namespace in opts.
func New(opts Options) (*Backend, error) {
	if opts.Table == "" {
		opts.Table = "weir"
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	connOpts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(forceBuffers)}
	if opts.NetNS != 0 {
		connOpts = append(connOpts, nftables.WithNetNSFd(opts.NetNS))
	}
	conn, err := nftables.New(connOpts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket: %w", err)
	}
	return &Backend{conn: conn, layout: &layout{table: tableFor(opts.Table), opts: opts}, state: newState(), log: opts.Log}, nil
}

func tableFor(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
}

// forceBuffers raises the netlink socket buffers past the system limits, as
// the nft tool does, so that a 10k-service batch fits.
func forceBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer))
	})
	return errors.Join(err, serr)
}

// Sync makes the kernel match p; see backends.Backend.
func (b *Backend) Sync(ctx context.Context, p *plan.Plan, changed []plan.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if changed == nil || !b.synced {
		return b.fullSync(p)
	}
	return b.partialSync(p, changed)
}

func (b *Backend) fullSync(p *plan.Plan) error {
	if !b.synced && b.layout.opts.LocalhostNodePorts {
		if err := setSysctl(b.layout.opts.NetNS, "net/ipv4/conf/all/route_localnet", "1"); err != nil {
			b.log.Warn("Cannot enable route_localnet; NodePorts on 127.0.0.1 will not work", "error", err)
		}
	}
	t, c := b.fullTxn(p)
	if err := b.commit(t); err != nil {
		return err
	}
	c.commit()
	b.state, b.synced = c.base, true
	return nil
}

// fullTxn builds the transaction that rewrites the whole table from p. The
// first one of a process replaces the table outright. Later ones empty and
// refill every object instead, keeping the table, the affinity map and each
// service's target id, so ClientIP affinity survives periodic full syncs.
func (b *Backend) fullTxn(p *plan.Plan) (*txn, *changes) {
	t := &txn{table: b.layout.table}
	if !b.synced {
		// Adding first makes the delete valid when the table does not exist yet.
		t.add(op{kind: opAddTable})
		t.add(op{kind: opDelTable})
	}
	b.layout.base(t, b.synced)
	if b.synced {
		for _, spec := range sortedSpecs(b.state.chains) {
			b.layout.delPickChain(t, spec)
		}
		for _, w := range sortedKeys(b.state.maps) {
			b.layout.delEndpointsMap(t, w)
		}
	}
	c := newChanges(newState())
	c.prior = b.state
	for _, k := range p.Keys() {
		c.update(k, p.Services[k])
	}
	c.write(t, b.layout)
	b.writeNodeSets(t, c, p, true)
	return t, c
}

// writeNodeSets keeps the sets that follow the Node object up to date: its
// IPv4 podCIDRs (local detection by NodeCIDR) and its IPv4 addresses
// (nodePortAddresses primary).
func (b *Backend) writeNodeSets(t *txn, c *changes, p *plan.Plan, full bool) {
	opts := b.layout.opts
	if opts.LocalDetector == DetectNodeCIDR {
		c.podCIDRs = v4Prefixes(p.Node.PodCIDRs)
		b.refillSet(t, setPodCIDRs, c.podCIDRs, c.base.podCIDRs, full)
	}
	if opts.NodePortPrimary {
		var hosts []netip.Prefix
		for _, a := range p.Node.Addresses {
			if a.Is4() {
				hosts = append(hosts, netip.PrefixFrom(a, 32))
			}
		}
		c.nodeAddrs = hosts
		b.refillSet(t, setNodePortCIDRs, hosts, c.base.nodeAddrs, full)
	}
}

// refillSet replaces an interval set's contents when they changed (always
// in a full sync, where base has just created or emptied the set).
func (b *Backend) refillSet(t *txn, name string, cur, old []netip.Prefix, full bool) {
	if !full && slices.Equal(cur, old) {
		return
	}
	set := b.layout.intervalSet(name)
	if !full {
		t.add(op{kind: opFlushSet, set: set})
	}
	t.addElems(set, prefixElements(cur)...)
}

func v4Prefixes(in []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range in {
		if p.Addr().Is4() {
			out = append(out, p.Masked())
		}
	}
	return out
}

func (b *Backend) partialSync(p *plan.Plan, changed []plan.Key) error {
	t, c := b.partialTxn(p, changed)
	if t.empty() {
		return nil
	}
	if err := b.commit(t); err != nil {
		return err
	}
	c.commit()
	return nil
}

// partialTxn builds the transaction for the changed keys only.
func (b *Backend) partialTxn(p *plan.Plan, changed []plan.Key) (*txn, *changes) {
	t := &txn{table: b.layout.table}
	c := newChanges(b.state)
	seen := make(map[plan.Key]bool, len(changed))
	for _, k := range changed {
		if !seen[k] {
			seen[k] = true
			c.update(k, p.Services[k])
		}
	}
	c.write(t, b.layout)
	b.writeNodeSets(t, c, p, false)
	return t, c
}

// commit sends the transaction as one netlink batch.
func (b *Backend) commit(t *txn) error {
	if err := t.apply(b.conn); err != nil {
		return fmt.Errorf("nftables: build transaction: %w", err)
	}
	if err := b.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: commit transaction to table ip %s: %w", b.layout.table.Name, err)
	}
	return nil
}

// Cleanup removes Weir's table; it is not an error when there is none.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conn.AddTable(b.layout.table)
	b.conn.DelTable(b.layout.table)
	if err := b.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table ip %s: %w", b.layout.table.Name, err)
	}
	b.state, b.synced = newState(), false
	return nil
}

// Close releases the netlink socket.
func (b *Backend) Close() error { return b.conn.CloseLasting() }
