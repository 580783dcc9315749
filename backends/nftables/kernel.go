package nftables

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/weirproxy/weir/internal/sysctl"
	"golang.org/x/sys/unix"
)

// socketBuffer is the netlink socket buffer size forced for large batches.
const socketBuffer = 64 << 20

// kernel is everything the sync path asks of nf_tables: commit a batch of
// transactions, read the ruleset generation, and turn on route_localnet.
// netlinkKernel is the real one; the package's tests put an in-memory
// model in its place. The backend calls it under its lock only.
type kernel interface {
	// commit applies the transactions as one batch, all or nothing.
	commit(txns []*txn) error
	// generation returns the ruleset generation, which every commit of
	// anyone's increments.
	generation() (uint32, error)
	// routeLocalnet lets packets to 127.0.0.0/8 be routed elsewhere, which
	// localhost node ports need.
	routeLocalnet() error
	// close releases the sockets.
	close() error
}

// netlinkKernel is nf_tables in one network namespace, over netlink: a
// lasting socket for the commits and another for the generation.
type netlinkKernel struct {
	netNS int
	// table names the tables in error messages.
	table string
	log   *slog.Logger
	// conn is nil after a failed commit, until the next one reopens it.
	conn *nftables.Conn
	// gen asks for the generation; nil until first needed or after an
	// error.
	gen *netlink.Conn
}

// newNetlinkKernel opens the commit socket in the namespace of opts.
func newNetlinkKernel(opts Options) (*netlinkKernel, error) {
	conn, err := openConn(opts.NetNS)
	if err != nil {
		return nil, err
	}
	return &netlinkKernel{netNS: opts.NetNS, table: opts.Table, log: opts.Log, conn: conn}, nil
}

// openConn opens a lasting netlink socket in the network namespace netNS (0:
// the caller's own) with buffers large enough for 10k services.
func openConn(netNS int) (*nftables.Conn, error) {
	connOpts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(forceBuffers)}
	if netNS != 0 {
		connOpts = append(connOpts, nftables.WithNetNSFd(netNS))
	}
	conn, err := nftables.New(connOpts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket: %w", err)
	}
	return conn, nil
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

// commit queues the transactions' ops on the socket and flushes them as
// one netlink batch, which the kernel applies atomically. After a failure
// the socket is dropped: it may still hold queued messages, a sticky error
// or unread replies.
func (k *netlinkKernel) commit(txns []*txn) error {
	err := k.send(txns)
	if err != nil {
		k.dropConn()
	}
	return err
}

func (k *netlinkKernel) send(txns []*txn) error {
	if k.conn == nil {
		conn, err := openConn(k.netNS)
		if err != nil {
			return err
		}
		k.conn = conn
	}
	for _, t := range txns {
		if err := t.apply(k.conn); err != nil {
			return fmt.Errorf("nftables: build transaction: %w", err)
		}
	}
	if err := k.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: commit transaction to tables ip/ip6 %s: %w", k.table, err)
	}
	return nil
}

// dropConn closes the commit socket after a failed commit. An error closing
// it changes nothing for the sync (the next commit opens a new socket), so
// it is logged, not returned.
func (k *netlinkKernel) dropConn() {
	if k.conn == nil {
		return
	}
	if err := k.conn.CloseLasting(); err != nil {
		k.log.Warn("nftables: closing the netlink socket of a failed commit failed; the next commit opens a new one", "error", err)
	}
	k.conn = nil
}

// generation returns the namespace's ruleset generation; after an error
// the next call dials a new socket.
func (k *netlinkKernel) generation() (uint32, error) {
	if k.gen == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: k.netNS})
		if err != nil {
			return 0, err
		}
		k.gen = c
	}
	g, err := generation(k.gen)
	if err != nil {
		// The request failed: the socket may hold its unread answer.
		_ = k.gen.Close()
		k.gen = nil
	}
	return g, err
}

func (k *netlinkKernel) routeLocalnet() error {
	return sysctl.Set(k.netNS, "net/ipv4/conf/all/route_localnet", "1")
}

func (k *netlinkKernel) close() error {
	var err error
	if k.gen != nil {
		err = k.gen.Close()
		k.gen = nil
	}
	if k.conn != nil {
		err = errors.Join(err, k.conn.CloseLasting())
		k.conn = nil
	}
	return err
}
