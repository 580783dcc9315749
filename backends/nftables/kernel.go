package nftables

import (
	"errors"
	"fmt"
	"log/slog"

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
	// batch returns a batch for a sync's transactions to be encoded into
	// as they are built, or nil when the kernel takes recorded ones.
	batch() *batch
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
	// conn is nil after a failed commit, until the next one reopens it;
	// sndbuf is the send buffer size last forced on it.
	conn   *netlink.Conn
	sndbuf int
	// answers receives the kernel's answers to a commit; seq numbers
	// the messages sent on conn, so that an answer names one message.
	answers []byte
	seq     uint32
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
	return &netlinkKernel{netNS: opts.NetNS, table: opts.Table, log: opts.Log, conn: conn, sndbuf: socketBuffer}, nil
}

// openConn opens a netlink socket in the network namespace netNS (0: the
// caller's own) with buffers large enough for 10k services.
func openConn(netNS int) (*netlink.Conn, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netNS})
	if err == nil {
		if err = forceBuffers(conn); err != nil {
			_ = conn.Close() // the socket is of no use
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket: %w", err)
	}
	return conn, nil
}

// forceBuffers raises the netlink socket buffers past the system limits, as
// the nft tool does: a 10k-service batch fits, a larger one raises the
// send buffer (fit).
func forceBuffers(c *netlink.Conn) error {
	return forceBuffer(c, unix.SO_SNDBUFFORCE, socketBuffer, unix.SO_RCVBUFFORCE, socketBuffer)
}

// forceBuffer sets each of the socket's buffer options (SO_*BUFFORCE) to
// its size; the kernel allows twice that.
func forceBuffer(c *netlink.Conn, optSizes ...int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		for i := 0; i+1 < len(optSizes); i += 2 {
			serr = errors.Join(serr, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, optSizes[i], optSizes[i+1]))
		}
	})
	return errors.Join(err, serr)
}

// commit sends the transactions as one netlink batch, which the kernel
// applies atomically. After a failure the socket is dropped: it may still
// hold unread answers.
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
		k.conn, k.sndbuf = conn, socketBuffer
	}
	b := batchOf(txns)
	switch {
	case b.err != nil:
		return fmt.Errorf("nftables: build transaction: %w", b.err)
	case len(b.pieces) == 0:
		return nil // no message: nothing would be answered
	}
	if k.seq > 1<<31 {
		k.seq = 0 // far from wrapping around within a batch
	}
	f := b.frame(k.seq + 1)
	k.seq = f.last + 1
	if err := k.fit(f.size); err != nil {
		return err
	}
	if k.answers == nil {
		k.answers = make([]byte, answerBuffer)
	}
	if err := sendBatch(k.conn, k.answers, b, f); err != nil {
		return fmt.Errorf("nftables: commit transaction to tables ip/ip6 %s: %w", k.table, err)
	}
	return nil
}

// fit raises the send buffer to hold a batch of size bytes: it goes in
// one sendmsg.
func (k *netlinkKernel) fit(size int) error {
	if size <= k.sndbuf {
		return nil
	}
	if err := forceBuffer(k.conn, unix.SO_SNDBUFFORCE, size); err != nil {
		return fmt.Errorf("nftables: size the netlink send buffer for %d bytes: %w", size, err)
	}
	k.sndbuf = size
	return nil
}

// batchOf returns the batch the transactions were encoded into as they
// were built, or one encoding the ops they recorded.
func batchOf(txns []*txn) *batch {
	for _, t := range txns {
		if t.out != nil {
			return t.out
		}
	}
	b := &batch{}
	for _, t := range txns {
		for _, o := range t.ops {
			b.op(t.table, o)
		}
	}
	return b
}

// dropConn closes the commit socket after a failed commit. An error closing
// it changes nothing for the sync (the next commit opens a new socket), so
// it is logged, not returned.
func (k *netlinkKernel) dropConn() {
	if k.conn == nil {
		return
	}
	if err := k.conn.Close(); err != nil {
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

// batch returns a fresh batch: what goes to the kernel is encoded once,
// while it is built.
func (k *netlinkKernel) batch() *batch { return &batch{} }

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
		err = errors.Join(err, k.conn.Close())
		k.conn = nil
	}
	return err
}
