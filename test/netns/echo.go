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
	ln    net.Listener
	wg    sync.WaitGroup
	greet []byte // sent first on every connection; nil for none

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// StartEcho listens on port, on the pod's IPv4 addresses, and echoes
// every line of every connection until Close.
func StartEcho(p *Pod, port uint16) (*Echo, error) {
	return startEcho(p, port, nil)
}

// StartGreeter is StartEcho with every connection opened by the line
// "<pod name>\n", so that a client of a service learns which pod holds
// its connection.
func StartGreeter(p *Pod, port uint16) (*Echo, error) {
	return startEcho(p, port, []byte(p.Name+"\n"))
}

func startEcho(p *Pod, port uint16, greet []byte) (*Echo, error) {
	e := &Echo{conns: map[net.Conn]bool{}, greet: greet}
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
	if e.greet != nil {
		if _, err := c.Write(e.greet); err != nil {
			return
		}
	}
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
