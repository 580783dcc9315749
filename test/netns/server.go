package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// server answers on one port of a pod, over TCP and UDP, with the line
// "<pod> <source address>\n".
type server struct {
	pod string
	tcp net.Listener
	udp *net.UDPConn
	wg  sync.WaitGroup
}

// startServer opens the sockets inside ns and serves them until close.
func startServer(ns *Namespace, pod string, port uint16) (*server, error) {
	s := &server{pod: pod}
	addr := netip.AddrPortFrom(netip.IPv4Unspecified(), port)
	err := ns.Do(func() error {
		l, err := net.Listen("tcp4", addr.String())
		if err != nil {
			return err
		}
		u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			l.Close()
			return err
		}
		s.tcp, s.udp = l, u
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listen on port %d: %w", port, err)
	}
	s.wg.Add(2)
	go s.serveTCP()
	go s.serveUDP()
	return s, nil
}

// line is the answer to a client seen at from.
func (s *server) line(from netip.AddrPort) []byte {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	return []byte(s.pod + " " + from.String() + "\n")
}

// serveTCP writes one line to each accepted connection and closes it.
func (s *server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. ECONNABORTED: the next Accept may succeed
		}
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write(s.line(c.RemoteAddr().(*net.TCPAddr).AddrPort()))
		c.Close()
	}
}

// serveUDP answers each datagram with one line.
func (s *server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. an ICMP error queued on the socket
		}
		s.udp.WriteToUDPAddrPort(s.line(from), from)
	}
}

// close stops serving and waits for the serving goroutines to exit.
func (s *server) close() error {
	err := errors.Join(s.tcp.Close(), s.udp.Close())
	s.wg.Wait()
	return err
}
