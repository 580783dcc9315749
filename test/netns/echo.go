package netns

import (
	"bufio"
	"fmt"
	"net"
	"sync"
)

// Echo is a TCP server in a pod that sends back every line it receives:
// the far end of a long-lived connection through a service.
type Echo struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// StartEcho listens on port, on the pod's IPv4 addresses, and echoes
// every line of every connection until Close.
func StartEcho(p *Pod, port uint16) (*Echo, error) {
	e := &Echo{conns: map[net.Conn]bool{}}
	err := p.NS.Do(func() (err error) {
		e.ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s: echo server: %w", p.Name, err)
	}
	e.wg.Go(func() {
		for {
			c, err := e.ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns[c] = true
			e.mu.Unlock()
			e.wg.Go(func() { e.serve(c) })
		}
	})
	return e, nil
}

// serve echoes the lines of c until it ends.
func (e *Echo) serve(c net.Conn) {
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		if _, err := c.Write(line); err != nil {
			return
		}
	}
}

// Close stops listening, closes every open connection and waits until
// their goroutines have ended.
func (e *Echo) Close() {
	e.ln.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}
