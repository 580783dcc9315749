package netns

import (
	"io"
	"net"
	"sync"
	"time"
)

// Forwarder listens inside a namespace and copies each connection to a
// target outside it. Tests forward a control plane's API server this way, on
// its own loopback address, so its kubeconfigs work unchanged in a node
// namespace; while the target is down, a connection is closed at once, as a
// refused one would be.
type Forwarder struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]bool
}

// Forward starts a Forwarder that listens on addr (host:port) inside ns and
// connects to the same addr outside it.
func Forward(ns *Namespace, addr string) (*Forwarder, error) {
	f := &Forwarder{target: addr, conns: map[net.Conn]bool{}}
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

func (f *Forwarder) serve() {
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
func (f *Forwarder) pipe(c net.Conn) {
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
	// A copy ends when either side closes; how it ended is of no interest.
	go func() { _, _ = io.Copy(up, c); copied <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); copied <- struct{}{} }()
	<-copied
	c.Close()
	up.Close()
	<-copied
}

func (f *Forwarder) track(conns ...net.Conn) bool {
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

func (f *Forwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
	}
}

// Close stops listening, closes every connection and waits for the copies.
func (f *Forwarder) Close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
