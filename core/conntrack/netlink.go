package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/internal/nsenter"
)

const (
	// ctnetlink message types: subsystem in the high byte.
	msgCtGet    = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	msgCtDelete = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE

	// recvBufSize holds any message the kernel sends: dump messages are at
	// most 32 KiB, whatever the reader's buffer.
	recvBufSize = 64 << 10
	// deleteBatch is how many delete requests go out in one write. Each
	// ack takes about a kilobyte of receive buffer until read.
	deleteBatch = 64
)

// errDeadline marks a read or write cut short by the context.
var errDeadline = errors.New("netlink i/o interrupted")

// conn is a NETLINK_NETFILTER socket used for one Clear call.
type conn struct {
	f   *os.File
	rc  syscall.RawConn
	seq uint32
	buf []byte
}

// dial opens a netlink socket in the namespace nsFd refers to, or in the
// calling thread's namespace when nsFd is negative.
func dial(nsFd int) (*conn, error) {
	fd, err := socketIn(nsFd)
	if err != nil {
		return nil, fmt.Errorf("conntrack: netlink socket: %w", err)
	}
	// Best effort: acks without the echoed request, error messages, and
	// room for a batch of acks whatever net.core.rmem_default says.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	return newConn(fd)
}

// newConn wraps a non-blocking datagram socket; tests pass one end of a
// socket pair standing in for the kernel.
func newConn(fd int) (*conn, error) {
	f := os.NewFile(uintptr(fd), "ctnetlink")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &conn{f: f, rc: rc, seq: uint32(time.Now().UnixNano()), buf: make([]byte, recvBufSize)}, nil
}

func (c *conn) close() { c.f.Close() }

// socketIn creates the socket on a thread switched into the namespace (nsFd
// < 0: the caller's own): a socket stays in the namespace it was created in.
func socketIn(nsFd int) (int, error) {
	open := func() (int, error) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		return fd, os.NewSyscallError("socket", err)
	}
	if nsFd < 0 {
		return open()
	}
	fd := -1
	err := nsenter.Do(nsFd, func() error {
		var err error
		fd, err = open()
		return err
	})
	if err != nil && fd >= 0 {
		// The socket was made, but the thread could not be switched back;
		// the socket itself is fine.
		return fd, nil
	}
	return fd, err
}

// bind makes ctx's deadline and cancellation interrupt the socket's reads
// and writes until the returned function is called. It fails when the
// socket takes no deadline (it is not in the runtime's poller).
func (c *conn) bind(ctx context.Context) (release func(), err error) {
	d, _ := ctx.Deadline()
	if err := c.f.SetDeadline(d); err != nil {
		return nil, fmt.Errorf("conntrack: netlink socket deadline: %w", err)
	}
	// A deadline in the past wakes blocked calls; it cannot fail where the
	// first one succeeded.
	stop := context.AfterFunc(ctx, func() { _ = c.f.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }, nil
}

// header is a netlink message header followed by a struct nfgenmsg.
func header(b []byte, typ, flags uint16, seq uint32, family uint8, payload int) []byte {
	n := unix.NLMSG_HDRLEN + nfgenLen + payload
	b = binary.NativeEndian.AppendUint32(b, uint32(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel fills it in
	return append(b, family, unix.NFNETLINK_V0, 0, 0)
}

// write sends one buffer of requests to the kernel.
func (c *conn) write(b []byte) error {
	var werr error
	err := c.rc.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), b)
		return werr != unix.EAGAIN
	})
	return ioErr("write", err, werr)
}

// read receives one datagram and returns its messages, checking that it
// came whole and from the kernel.
func (c *conn) read() ([]syscall.NetlinkMessage, error) {
	b, err := c.recv()
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformed, err)
	}
	return msgs, nil
}

// recv receives one datagram from the kernel into the connection's buffer
// and returns it, valid until the next call; it checks that the datagram
// came whole.
func (c *conn) recv() ([]byte, error) {
	for {
		var n, flags int
		var from unix.Sockaddr
		var rerr error
		err := c.rc.Read(func(fd uintptr) bool {
			n, _, flags, from, rerr = unix.Recvmsg(int(fd), c.buf, nil, 0)
			return rerr != unix.EAGAIN
		})
		if err := ioErr("read", err, rerr); err != nil {
			return nil, err
		}
		if sa, ok := from.(*unix.SockaddrNetlink); ok && sa.Pid != 0 {
			continue // not from the kernel
		}
		if flags&unix.MSG_TRUNC != 0 {
			return nil, fmt.Errorf("netlink message truncated at %d bytes", len(c.buf))
		}
		return c.buf[:n], nil
	}
}

// nextMessage splits the first netlink message off b without copying: its
// header, its payload and what follows it.
func nextMessage(b []byte) (h syscall.NlMsghdr, data, rest []byte, err error) {
	if len(b) < unix.NLMSG_HDRLEN {
		return h, nil, nil, fmt.Errorf("%w: %d trailing bytes", errMalformed, len(b))
	}
	h = syscall.NlMsghdr{
		Len:   binary.NativeEndian.Uint32(b),
		Type:  binary.NativeEndian.Uint16(b[4:]),
		Flags: binary.NativeEndian.Uint16(b[6:]),
		Seq:   binary.NativeEndian.Uint32(b[8:]),
		Pid:   binary.NativeEndian.Uint32(b[12:]),
	}
	if h.Len < unix.NLMSG_HDRLEN || int(h.Len) > len(b) {
		return h, nil, nil, fmt.Errorf("%w: message length %d of %d bytes", errMalformed, h.Len, len(b))
	}
	return h, b[unix.NLMSG_HDRLEN:h.Len], b[min(align4(int(h.Len)), len(b)):], nil
}

// ioErr folds a poller error and a system call error into one.
func ioErr(op string, pollErr, sysErr error) error {
	switch {
	case errors.Is(pollErr, os.ErrDeadlineExceeded):
		return fmt.Errorf("netlink %s: %w", op, errDeadline)
	case pollErr != nil:
		return fmt.Errorf("netlink %s: %w", op, pollErr)
	case sysErr != nil:
		return os.NewSyscallError(op, sysErr)
	}
	return nil
}

// dump streams the whole conntrack table, every address family, to visit,
// one message payload (nfgenmsg and attributes) at a time; the payload is
// valid only during the call. interrupted reports that the kernel flagged
// the dump as inconsistent.
func (c *conn) dump(visit func(payload []byte)) (interrupted bool, err error) {
	interrupted, _, err = c.dumpUntil(func(b []byte) bool { visit(b); return true })
	return interrupted, err
}

// dumpUntil is dump, stopping as soon as visit returns false (stopped):
// the rest of the dump is then left unread, and the connection must be
// closed. It walks each datagram in place, allocating nothing per entry.
func (c *conn) dumpUntil(visit func(payload []byte) bool) (interrupted, stopped bool, err error) {
	c.seq++
	seq := c.seq
	req := header(nil, msgCtGet, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, unix.AF_UNSPEC, 0)
	if err := c.write(req); err != nil {
		return false, false, err
	}
	for {
		b, err := c.recv()
		if err != nil {
			return interrupted, false, err
		}
		for len(b) > 0 {
			h, data, rest, err := nextMessage(b)
			if err != nil {
				return interrupted, false, err
			}
			b = rest
			if h.Seq != seq {
				continue // a late answer to an earlier request
			}
			interrupted = interrupted || h.Flags&unix.NLM_F_DUMP_INTR != 0
			switch h.Type {
			case unix.NLMSG_DONE:
				return interrupted, false, doneError(data)
			case unix.NLMSG_ERROR:
				return interrupted, false, ackError(syscall.NetlinkMessage{Header: h, Data: data})
			case unix.NLMSG_NOOP, unix.NLMSG_OVERRUN:
			default:
				if !visit(data) {
					return interrupted, true, nil
				}
			}
		}
	}
}

// doneError returns the error code an NLMSG_DONE's payload may carry.
func doneError(data []byte) error {
	if len(data) >= 4 {
		if e := int32(binary.NativeEndian.Uint32(data)); e < 0 {
			return syscall.Errno(-e)
		}
	}
	return nil
}

// ackError decodes an NLMSG_ERROR message: nil for a plain ack, else the
// errno, with the kernel's extended-ack message when it sent one.
func ackError(m syscall.NetlinkMessage) error {
	if len(m.Data) < 4 {
		return fmt.Errorf("%w: short error message", errMalformed)
	}
	e := int32(binary.NativeEndian.Uint32(m.Data))
	if e == 0 {
		return nil
	}
	err := error(syscall.Errno(-e))
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 || len(m.Data) < 4+unix.NLMSG_HDRLEN {
		return err
	}
	off := 4 + unix.NLMSG_HDRLEN // the echoed request header
	if m.Header.Flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + align4(int(binary.NativeEndian.Uint32(m.Data[4:]))) // the whole request
	}
	if off > len(m.Data) {
		return err
	}
	var it attrIter
	it.reset(m.Data[off:])
	for it.next() {
		if it.typ == unix.NLMSGERR_ATTR_MSG {
			return fmt.Errorf("%w: %s", err, unix.ByteSliceToString(it.data))
		}
	}
	return err
}

// deleteAll deletes the matched entries, deleteBatch requests per write,
// and returns how many the kernel deleted in each family. An entry already
// gone (ENOENT: expired, deleted by someone else, or recreated with another
// ID) is not an error.
func (c *conn) deleteAll(matches []match, what string) (deleted Deleted, errs []error) {
	for len(matches) > 0 {
		batch := matches[:min(deleteBatch, len(matches))]
		matches = matches[len(batch):]
		n, berrs, err := c.deleteBatch(batch)
		deleted = deleted.plus(n)
		errs = append(errs, berrs...)
		if err != nil {
			return deleted, append(errs, fmt.Errorf("conntrack: delete entries for %s: %w (up to %d entries not deleted)",
				what, err, len(batch)-n.Total()+len(matches)))
		}
	}
	return deleted, errs
}

// deleteBatch sends one write of delete requests and collects their acks.
// err is set when the exchange itself failed; the acks not yet read are
// then unknown.
func (c *conn) deleteBatch(batch []match) (deleted Deleted, errs []error, err error) {
	first := c.seq + 1
	var req []byte
	for _, m := range batch {
		c.seq++
		req = header(req, msgCtDelete, unix.NLM_F_REQUEST|unix.NLM_F_ACK, c.seq, m.family, len(m.attrs))
		req = append(req, m.attrs...)
	}
	if err := c.write(req); err != nil {
		return Deleted{}, nil, err
	}
	acked := make([]bool, len(batch))
	for pending := len(batch); pending > 0; {
		msgs, err := c.read()
		if err != nil {
			return deleted, errs, err
		}
		for _, msg := range msgs {
			i := msg.Header.Seq - first // wraps past len(batch) for older sequence numbers
			if msg.Header.Type != unix.NLMSG_ERROR || i >= uint32(len(batch)) || acked[i] {
				continue
			}
			acked[i] = true
			pending--
			switch err := ackError(msg); {
			case err == nil:
				deleted.count(batch[i].family)
			case errors.Is(err, unix.ENOENT):
			default:
				m := batch[i]
				errs = append(errs, fmt.Errorf("conntrack: delete %s (%s): %w", m.entry, m.why, err))
			}
		}
	}
	return deleted, errs, nil
}
