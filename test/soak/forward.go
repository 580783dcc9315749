package soak

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// forwarder listens inside a namespace on the API server's own loopback
// address and copies each connection to the API server outside, so the
// control plane's kubeconfigs work unchanged in the node. While the API
// server is down, a connection is closed at once, as a refused one would be.
type forwarder struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]bool
}

// forward starts a forwarder of addr (host:port) inside ns.
func forward(ns *netns.Namespace, addr string) (*forwarder, error) {
	f := &forwarder{target: addr, conns: map[net.Conn]bool{}}
	err := ns.Do(func() (err error) {
		f.ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	f.wg.Go(f.serve)
	return f, nil
}

func (f *forwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Go(func() { f.pipe(c) })
	}
}

// pipe copies between c and a new connection to the target until either
// side closes.
func (f *forwarder) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil || !f.track(c, up) {
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	defer f.untrack(c, up)
	copied := make(chan struct{}, 2)
	go func() { io.Copy(up, c); copied <- struct{}{} }()
	go func() { io.Copy(c, up); copied <- struct{}{} }()
	<-copied
	c.Close()
	up.Close()
	<-copied
}

func (f *forwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	for _, c := range conns {
		f.conns[c] = true
	}
	return true
}

func (f *forwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
	}
}

// close stops listening, closes every connection and waits for the copies.
func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
