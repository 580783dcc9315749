package netns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// TestEcho holds a connection from the client to a pod's echo server:
// every line comes back, two connections at once are served, and Close
// ends them.
func TestEcho(t *testing.T) {
	topo := NewThreePods(t)
	e, err := StartEcho(topo.Pods["pod-a"], 9090)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(PodA.String(), "9090")
	var conns [2]net.Conn
	for i := range conns {
		err := topo.Client.Do(func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			conns[i], err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		defer conns[i].Close()
	}
	for round := range 3 {
		for i, c := range conns {
			msg := fmt.Sprintf("conn %d line %d\n", i, round)
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.WriteString(c, msg); err != nil {
				t.Fatal(err)
			}
			if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != msg {
				t.Fatalf("echo of %q: %q, %v", msg, got, err)
			}
		}
	}
	e.Close()
	_ = conns[0].SetDeadline(time.Now().Add(2 * time.Second))
	if n, err := conns[0].Read(make([]byte, 1)); err == nil {
		t.Errorf("after Close the connection still reads %d bytes", n)
	}
}
