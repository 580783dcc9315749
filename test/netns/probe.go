package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Probe failures, to be matched with errors.Is; the underlying system error
// stays wrapped too.
var (
	// ErrRefused means the connection was actively refused: a TCP reset or
	// an ICMP or ICMPv6 port-unreachable (what a reject rule sends by
	// default).
	ErrRefused = errors.New("netns: connection refused")
	// ErrUnreachable means an ICMP host- or network-unreachable came back,
	// or there was no route.
	ErrUnreachable = errors.New("netns: unreachable")
	// ErrTimeout means nothing came back before the context's deadline.
	ErrTimeout = errors.New("netns: timed out")
	// ErrSendRejected means a rule of the sender's own namespace refused
	// the datagram on its way out: the send failed with EPERM. It comes
	// with what the read after it gave, ErrRefused (a reject's ICMP error
	// queued for the socket) or ErrTimeout (a drop). A refusal by another
	// namespace, the datagram having left, never carries it.
	ErrSendRejected = errors.New("netns: rejected by the sender's own rules")
)

// Answer is what a pod server replied: who answered and whom it saw.
type Answer struct {
	// Pod is the name of the answering pod.
	Pod string
	// Source is the peer address the pod saw; after masquerading it is the
	// node's, otherwise the prober's own.
	Source netip.AddrPort
}

// String formats the answer as the server's line, without the newline.
func (a Answer) String() string {
	return a.Pod + " " + a.Source.String()
}

// DialTCP connects from the namespace to addr and reads the answer line.
// ctx bounds the whole exchange and should carry a deadline: without one, a
// silently dropped SYN is retried for minutes.
func (n *Namespace) DialTCP(ctx context.Context, addr netip.AddrPort) (Answer, error) {
	conn, err := n.connectTCP(ctx, addr)
	if err != nil {
		return Answer{}, probeError(ctx, "tcp", n, addr, err)
	}
	defer conn.Close()
	defer bindContext(ctx, conn)()
	b, err := io.ReadAll(io.LimitReader(conn, 512))
	if err != nil {
		return Answer{}, probeError(ctx, "tcp", n, addr, err)
	}
	return parseAnswer(b)
}

// connectPoll is how often connectTCP looks for a soft connect error.
const connectPoll = 5 * time.Millisecond

// connectTCP opens a TCP socket in the namespace and connects it to addr.
//
// It does not use net.Dialer because of a race on veth: the SYN, the
// node's reject and the ICMP error coming back can all be processed inside
// the connect system call, while it holds the socket lock. The kernel then
// records the error only as a soft error and retries the SYN a second
// later. connectTCP polls SO_ERROR, which reports soft errors too, and
// fails at once, as the kernel would have had the socket not been locked.
func (n *Namespace) connectTCP(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	if err := checkRemote(addr); err != nil {
		return nil, err
	}
	family, sa := sockaddr(addr)
	var fd int
	err := n.Do(func() (err error) {
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return os.NewSyscallError("socket", err)
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "tcp "+addr.String())
	defer f.Close() // net.FileConn holds its own duplicate
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return nil, os.NewSyscallError("connect", err)
	}
	if err := awaitConnect(ctx, fd); err != nil {
		return nil, err
	}
	return net.FileConn(f)
}

// checkRemote rejects addresses the probes cannot dial: invalid ones and
// ones with a zone, which would have to be resolved to an interface index
// inside the namespace (Go's resolver caches zones process-wide).
func checkRemote(addr netip.AddrPort) error {
	switch {
	case !addr.IsValid():
		return fmt.Errorf("netns: invalid address %s", addr)
	case addr.Addr().Zone() != "":
		return fmt.Errorf("netns: %s: addresses with a zone are not supported", addr)
	}
	return nil
}

// sockaddr returns the socket family and address for addr: AF_INET for an
// IPv4 address (or an IPv4-mapped IPv6 one), AF_INET6 otherwise.
func sockaddr(addr netip.AddrPort) (int, unix.Sockaddr) {
	if a := addr.Addr().Unmap(); a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
}

// awaitConnect waits until the non-blocking connect on fd completes, fails
// (with a hard or soft error), or ctx ends.
func awaitConnect(ctx context.Context, fd int) error {
	for {
		if err := soError(fd); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		_, err := unix.Poll(pfd, int(connectPoll/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return os.NewSyscallError("poll", err)
		}
		if ev := pfd[0].Revents; ev != 0 {
			if err := soError(fd); err != nil {
				return err
			}
			if ev&(unix.POLLERR|unix.POLLHUP) != 0 {
				return os.NewSyscallError("connect", unix.ECONNABORTED)
			}
			return nil // writable without error: connected
		}
	}
}

// soError returns the socket's pending error, hard or soft, and clears it.
func soError(fd int) error {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return os.NewSyscallError("getsockopt", err)
	}
	if v != 0 {
		return os.NewSyscallError("connect", unix.Errno(v))
	}
	return nil
}

// UDPConn is a connected UDP socket in a namespace; it keeps its local
// address across exchanges, so conntrack sees one flow.
type UDPConn struct {
	conn   *net.UDPConn
	ns     *Namespace
	remote netip.AddrPort
}

// DialUDP opens a UDP socket in the namespace bound to local and connected
// to remote, IPv4 or IPv6 as remote is (an IPv4-mapped remote counts as
// IPv4). A zero local picks an ephemeral port.
//
// Because the socket is connected, answers whose source is not remote (for
// instance a reply that escaped reverse NAT) are dropped by the kernel, and
// an ICMP port-unreachable surfaces as ErrRefused.
func (n *Namespace) DialUDP(local, remote netip.AddrPort) (*UDPConn, error) {
	if err := checkRemote(remote); err != nil {
		return nil, err
	}
	network := "udp6"
	if remote.Addr().Unmap().Is4() {
		network = "udp4"
	}
	var laddr *net.UDPAddr
	if local.IsValid() {
		laddr = net.UDPAddrFromAddrPort(local)
	}
	var conn *net.UDPConn
	err := n.Do(func() error {
		c, err := net.DialUDP(network, laddr, net.UDPAddrFromAddrPort(remote))
		conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("udp %s from %s: %w", remote, n.Name, err)
	}
	return &UDPConn{conn: conn, ns: n, remote: remote}, nil
}

// LocalAddr returns the socket's local address.
func (c *UDPConn) LocalAddr() netip.AddrPort {
	return c.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Ask sends one datagram and returns the answer, within ctx. Answers and
// errors left over from earlier, timed-out exchanges are discarded first.
// A datagram rejected by a rule in the sender's own namespace (the send
// fails with EPERM) still reads as ErrRefused once the reject's ICMP error
// arrives, and as ErrSendRejected too.
func (c *UDPConn) Ask(ctx context.Context) (Answer, error) {
	if err := c.drain(); err != nil {
		return Answer{}, err
	}
	defer bindContext(ctx, c.conn)()
	_, werr := c.conn.Write([]byte("?\n"))
	if werr != nil && !errors.Is(werr, syscall.EPERM) {
		return Answer{}, probeError(ctx, "udp", c.ns, c.remote, werr)
	}
	// EPERM: a filter in this namespace dropped the datagram; if it was a
	// reject, its ICMP error is already queued for the read below.
	buf := make([]byte, 512)
	n, err := c.conn.Read(buf)
	if err != nil {
		return Answer{}, probeError(ctx, "udp", c.ns, c.remote, errors.Join(werr, err))
	}
	return parseAnswer(buf[:n])
}

// drain discards queued datagrams and pending socket errors.
func (c *UDPConn) drain() error {
	rc, err := c.conn.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 512)
	return rc.Read(func(fd uintptr) bool {
		for {
			_, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			switch {
			case err == nil, errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNREFUSED),
				errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
				// discarded; look for more
			default:
				return true // EAGAIN: nothing left
			}
		}
	})
}

// Close closes the socket.
func (c *UDPConn) Close() error {
	return c.conn.Close()
}

// AskUDP sends one datagram from an ephemeral port to remote and returns
// the answer, within ctx.
func (n *Namespace) AskUDP(ctx context.Context, remote netip.AddrPort) (Answer, error) {
	c, err := n.DialUDP(netip.AddrPort{}, remote)
	if err != nil {
		return Answer{}, err
	}
	defer c.Close()
	return c.Ask(ctx)
}

// Tally counts answers per pod, for distribution tests.
func Tally(answers []Answer) map[string]int {
	m := map[string]int{}
	for _, a := range answers {
		m[a.Pod]++
	}
	return m
}

// bindContext applies ctx's deadline and cancellation to c until the
// returned function is called.
func bindContext(ctx context.Context, c net.Conn) (release func()) {
	// Deadlines fail only on a closed connection, whose calls fail anyway.
	d, _ := ctx.Deadline() // zero: no deadline
	_ = c.SetDeadline(d)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.SetDeadline(time.Unix(1, 0)) // in the past: wake blocked calls
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired
		}
		_ = c.SetDeadline(time.Time{})
	}
}

// probeError describes a failed probe and wraps the matching sentinels:
// one of ErrRefused, ErrUnreachable and ErrTimeout, and ErrSendRejected
// when the send failed with EPERM.
func probeError(ctx context.Context, proto string, n *Namespace, addr netip.AddrPort, err error) error {
	var kind error
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = ErrRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		kind = ErrUnreachable
	case ctx.Err() != nil, errors.As(err, &ne) && ne.Timeout():
		kind = ErrTimeout
	}
	if errors.Is(err, syscall.EPERM) {
		err = fmt.Errorf("%w: %w", ErrSendRejected, err)
	}
	if kind == nil {
		return fmt.Errorf("%s %s from %s: %w", proto, addr, n.Name, err)
	}
	return fmt.Errorf("%s %s from %s: %w: %w", proto, addr, n.Name, kind, err)
}

// parseAnswer parses a server line "<pod> <addr:port>\n".
func parseAnswer(b []byte) (Answer, error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return Answer{}, fmt.Errorf("netns: malformed answer %q", b)
	}
	src, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Answer{}, fmt.Errorf("netns: malformed answer %q: %w", b, err)
	}
	return Answer{Pod: f[0], Source: src}, nil
}
