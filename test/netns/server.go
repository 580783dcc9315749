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
// "<pod> <source address>\n": on all IPv4 addresses and, if the pod has
// one, on its IPv6 address.
type server struct {
	pod string
	tcp []net.Listener
	udp []*net.UDPConn
	wg  sync.WaitGroup
}

// startServer opens the sockets inside ns and serves them until close. If
// ip6 is valid, it also listens on ip6 (IPv6 only; the IPv4 sockets stay
// IPv4 only, so a v4 client's address never reads as ::ffff:a.b.c.d).
func startServer(ns *Namespace, pod string, port uint16, ip6 netip.Addr) (*server, error) {
	s := &server{pod: pod}
	type bind struct {
		tcp, udp string // the networks
		addr     netip.AddrPort
	}
	binds := []bind{{"tcp4", "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), port)}}
	if ip6.IsValid() {
		binds = append(binds, bind{"tcp6", "udp6", netip.AddrPortFrom(ip6, port)})
	}
	err := ns.Do(func() error {
		for _, b := range binds {
			l, err := net.Listen(b.tcp, b.addr.String())
			if err != nil {
				return err
			}
			s.tcp = append(s.tcp, l)
			u, err := net.ListenUDP(b.udp, net.UDPAddrFromAddrPort(b.addr))
			if err != nil {
				return err
			}
			s.udp = append(s.udp, u)
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("listen on port %d: %w", port, err), s.closeSockets())
	}
	for _, l := range s.tcp {
		s.wg.Add(1)
		go s.serveTCP(l)
	}
	for _, u := range s.udp {
		s.wg.Add(1)
		go s.serveUDP(u)
	}
	return s, nil
}

// line is the answer to a client seen at from.
func (s *server) line(from netip.AddrPort) []byte {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	return []byte(s.pod + " " + from.String() + "\n")
}

// serveTCP writes one line to each accepted connection and closes it.
func (s *server) serveTCP(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. ECONNABORTED: the next Accept may succeed
		}
		// A client gone before its answer is the client's failure to report.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(s.line(c.RemoteAddr().(*net.TCPAddr).AddrPort()))
		c.Close()
	}
}

// serveUDP answers each datagram with one line.
func (s *server) serveUDP(u *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := u.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. an ICMP error queued on the socket
		}
		_, _ = u.WriteToUDPAddrPort(s.line(from), from) // a lost answer is the prober's failure to report
	}
}

// close stops serving and waits for the serving goroutines to exit.
func (s *server) close() error {
	err := s.closeSockets()
	s.wg.Wait()
	return err
}

// closeSockets closes every socket the server opened.
func (s *server) closeSockets() error {
	var errs []error
	for _, l := range s.tcp {
		errs = append(errs, l.Close())
	}
	for _, u := range s.udp {
		errs = append(errs, u.Close())
	}
	return errors.Join(errs...)
}
