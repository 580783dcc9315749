package ipvs

import (
	"errors"
	"fmt"
	"syscall"
	"time"
	"unsafe"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Pipelining bounds: one write carries at most writeBytes of requests
// and at most maxInFlight of them, whose acknowledgements (about 1 KiB
// of socket memory each) must fit the receive buffer of rcvBufBytes.
const (
	writeBytes  = 64 << 10
	maxInFlight = 256
	rcvBufBytes = 4 << 20
	// recvSlots datagrams of slotBytes are read per recvmmsg call; the
	// kernel sizes dump datagrams after the reader's buffer.
	recvSlots = 64
	slotBytes = 16 << 10
	// recvTimeout ends a wait for an answer the kernel never sends.
	recvTimeout = time.Minute
)

// genlConn is an IPVS generic-netlink client of our own that pipelines:
// it writes many acknowledged requests per sendto and reads their
// acknowledgements many per recvmmsg, where github.com/moby/ipvs does one
// request and one round trip per call. It is not safe for concurrent use.
type genlConn struct {
	sock   *nl.NetlinkSocket
	fd     int
	family uint16
	seq    uint32
	// timeout bounds a wait for an answer.
	timeout time.Duration
	bufs    [][]byte
	hdrs    []mmsghdr
	iovs    []unix.Iovec
}

// mmsghdr is struct mmsghdr of recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// newGenlConn opens the socket in the network namespace fd (0: the
// caller's); h, in the same namespace, resolves the IPVS family once.
func newGenlConn(h *netlink.Handle, fd int) (*genlConn, error) {
	fam, err := h.GenlFamilyGet("IPVS")
	if err != nil {
		return nil, fmt.Errorf("ipvs: resolve the IPVS generic netlink family: %w", err)
	}
	return dialGenl(fd, fam.ID)
}

// dialGenl opens a client of the family fam (IPVS's, already resolved)
// on a new socket in the network namespace fd (0: the caller's).
func dialGenl(fd int, fam uint16) (*genlConn, error) {
	ns := vnetns.None()
	if fd != 0 {
		ns = vnetns.NsHandle(fd)
	}
	s, err := nl.GetNetlinkSocketAt(ns, vnetns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("ipvs: open generic netlink socket: %w", err)
	}
	return onSocket(s, fam)
}

// onSocket returns a client on the generic netlink socket s for family
// fam; it closes s when it fails.
func onSocket(s *nl.NetlinkSocket, fam uint16) (*genlConn, error) {
	c := &genlConn{sock: s, fd: s.GetFd(), family: fam, timeout: recvTimeout}
	if err := c.tune(); err != nil {
		s.Close()
		return nil, err
	}
	c.bufs = make([][]byte, recvSlots)
	c.hdrs = make([]mmsghdr, recvSlots)
	c.iovs = make([]unix.Iovec, recvSlots)
	for i := range c.bufs {
		c.bufs[i] = make([]byte, slotBytes)
	}
	return c, nil
}

// tune makes room for a window of acknowledgements and asks for bare
// ones (no copy of a failed request).
func (c *genlConn) tune() error {
	if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBufBytes) != nil {
		// Without CAP_NET_ADMIN: as much as rmem_max allows.
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBufBytes); err != nil {
			return fmt.Errorf("ipvs: size generic netlink receive buffer: %w", err)
		}
	}
	if err := unix.SetsockoptInt(c.fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		return fmt.Errorf("ipvs: set NETLINK_CAP_ACK: %w", err)
	}
	return nil
}

// Close closes the socket.
func (c *genlConn) Close() { c.sock.Close() }

func (c *genlConn) nextSeq() uint32 {
	c.seq++
	return c.seq
}

// write sends requests (whole messages) in one datagram.
func (c *genlConn) write(b []byte) error {
	for {
		err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if err != unix.EINTR {
			return err
		}
	}
}

// read waits for at least one datagram and returns the netlink messages
// of all that are queued, up to recvSlots.
func (c *genlConn) read() ([]syscall.NetlinkMessage, error) {
	for i := range c.hdrs {
		c.iovs[i] = unix.Iovec{Base: &c.bufs[i][0]}
		c.iovs[i].SetLen(slotBytes)
		c.hdrs[i] = mmsghdr{}
		c.hdrs[i].hdr.Iov = &c.iovs[i]
		c.hdrs[i].hdr.SetIovlen(1)
	}
	var n uintptr
	for {
		var errno syscall.Errno
		n, _, errno = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&c.hdrs[0])),
			recvSlots, unix.MSG_WAITFORONE, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.EAGAIN {
			// The socket is non-blocking (nl's, for Go's poller); the
			// kernel answers within sendto, so this is a safety net.
			if err := c.wait(); err != nil {
				return nil, err
			}
			continue
		}
		if errno != 0 {
			return nil, errno
		}
		break
	}
	var msgs []syscall.NetlinkMessage
	for i := range int(n) {
		h := c.hdrs[i]
		if h.hdr.Flags&unix.MSG_TRUNC != 0 {
			return nil, errors.New("ipvs: netlink datagram truncated")
		}
		m, err := syscall.ParseNetlinkMessage(c.bufs[i][:h.n])
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m...)
	}
	return msgs, nil
}

// wait blocks until the socket has something to read, or c.timeout.
func (c *genlConn) wait() error {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(c.timeout.Milliseconds()))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("no answer from the kernel within %s", c.timeout)
		}
		return nil
	}
}

// ackErr returns the error an NLMSG_ERROR or NLMSG_DONE message carries
// (nil: success).
func ackErr(m syscall.NetlinkMessage) error {
	if len(m.Data) < 4 {
		return nil
	}
	if e := int32(native.Uint32(m.Data)); e < 0 {
		return syscall.Errno(-e)
	}
	return nil
}

// pipeline sends the acknowledged requests reqs, each one message with a
// sequence number first+i, in writes of at most writeBytes and
// maxInFlight requests, reading each write's acknowledgements before the
// next. It returns each request's error (nil: done); after a transport
// error, errs covers only the requests whose fate is known.
func (c *genlConn) pipeline(reqs [][]byte, first uint32) (errs []error, err error) {
	errs = make([]error, 0, len(reqs))
	var buf []byte // grows to the largest write, then is reused
	for len(errs) < len(reqs) {
		start := len(errs)
		end := windowEnd(reqs, start)
		buf = buf[:0]
		for _, r := range reqs[start:end] {
			buf = append(buf, r...)
		}
		if err := c.write(buf); err != nil {
			return errs, fmt.Errorf("ipvs: send to generic netlink: %w", err)
		}
		window := make([]error, end-start)
		pending := end - start
		for pending > 0 {
			msgs, err := c.read()
			if err != nil {
				return errs, fmt.Errorf("ipvs: read generic netlink acknowledgements: %w", err)
			}
			for _, m := range msgs {
				i := int(m.Header.Seq - first)
				if m.Header.Type != unix.NLMSG_ERROR || i < start || i >= end {
					continue
				}
				window[i-start] = ackErr(m)
				pending--
			}
		}
		errs = append(errs, window...)
	}
	return errs, nil
}

// windowEnd returns the end of the write that starts at reqs[start]: at
// most maxInFlight requests and writeBytes, but at least one request.
func windowEnd(reqs [][]byte, start int) int {
	end, size := start, 0
	for end < len(reqs) && end-start < maxInFlight && (end == start || size+len(reqs[end]) <= writeBytes) {
		size += len(reqs[end])
		end++
	}
	return end
}

// dump sends one dump request (a message from beginMsg with seq) and
// calls each for every answer's payload until NLMSG_DONE.
func (c *genlConn) dump(req []byte, seq uint32, each func([]byte) error) error {
	if err := c.write(req); err != nil {
		return fmt.Errorf("send to generic netlink: %w", err)
	}
	var first error
	for {
		msgs, err := c.read()
		if err != nil {
			return fmt.Errorf("read generic netlink dump: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if err := ackErr(m); err != nil && first == nil {
					first = err
				}
				return first
			case unix.NLMSG_ERROR:
				if err := ackErr(m); err != nil {
					return err
				}
			default:
				if err := each(m.Data); err != nil && first == nil {
					first = err
				}
			}
		}
	}
}

// services dumps every virtual server of the namespace.
func (c *genlConn) services() ([]*ipvs.Service, error) {
	seq := c.nextSeq()
	req, at := beginMsg(nil, c.family, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, cmdGetService)
	endMsg(req, at)
	var out []*ipvs.Service
	err := c.dump(req, seq, func(p []byte) error {
		s, err := decodeService(p)
		if err == nil {
			out = append(out, s)
		}
		return err
	})
	return out, err
}

// dests dumps the real servers of the virtual server k.
func (c *genlConn) dests(k vsKey) ([]*ipvs.Destination, error) {
	var out []*ipvs.Destination
	err := c.dumpDests(k, func(attrs []attr) {
		out = append(out, destFromAttrs(attrs, family(k.addr)))
	})
	return out, err
}

// dumpDests dumps the real servers of the virtual server k and calls each
// with the attributes of every one.
func (c *genlConn) dumpDests(k vsKey, each func([]attr)) error {
	seq := c.nextSeq()
	req, at := beginMsg(nil, c.family, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, cmdGetDest)
	req = putService(req, k, nil)
	endMsg(req, at)
	return c.dump(req, seq, func(p []byte) error {
		attrs, err := nested(p, attrDest)
		if err == nil {
			each(attrs)
		}
		return err
	})
}
