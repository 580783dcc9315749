//go:build vm

package ipvs

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Kernel tests need IPVS, which the host kernel lacks: they build only with
// the vm tag and run inside the VM of `make test-vm`.

// The pods of netns.ThreePods, the topology every kernel test here uses.
var podA, podB, podC = netns.PodA, netns.PodB, netns.PodC

var vip = netip.MustParseAddr("10.96.0.10")

const podPort = netns.PodPort

// newCluster builds the three pods' topology and a backend in its node.
func newCluster(t *testing.T, opts Options) (*netns.Topology, *Backend) {
	t.Helper()
	topo := netns.NewThreePods(t)
	opts.NetNS = topo.Node.Fd()
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return topo, b
}

func backendsCommon(fd int) backends.Common { return backends.Common{NetNS: fd} }

func podEP(a netip.Addr, weight uint32) plan.Endpoint { return ep(a.String(), podPort, weight) }

func testPlan(svcs ...*plan.Service) *plan.Plan {
	p := &plan.Plan{Node: plan.Node{Name: "node"}, Services: map[plan.Key]*plan.Service{}}
	for _, s := range svcs {
		p.Services[s.Key] = s
	}
	return p
}

func mustSync(t *testing.T, b *Backend, p *plan.Plan, req backends.SyncRequest) {
	t.Helper()
	if err := b.Sync(context.Background(), p, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// kernelServers reads every virtual server of the node, as
// "PROTO addr:port" → its settings and real servers.
func kernelServers(t *testing.T, b *Backend) map[string]string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	all, err := readKernel(b.genl, func(vsKey) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, vs := range all {
		out[k.String()] = vs.String()
	}
	return out
}

// addForeign adds a virtual server behind the backend's back.
func addForeign(t *testing.T, b *Backend, k vsKey, reals ...netip.AddrPort) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	svc := toService(k, newVirtualServer("rr", 0))
	if err := b.ipvs.NewService(svc); err != nil {
		t.Fatalf("add %s: %v", k, err)
	}
	for _, r := range reals {
		if err := b.ipvs.NewDestination(svc, toDestination(r, 1)); err != nil {
			t.Fatalf("add %s to %s: %v", r, k, err)
		}
	}
}

// eventually polls cond every 50 ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// askUDPMany sends n datagrams from fresh ports of ns to addr and returns
// who answered.
func askUDPMany(t *testing.T, ns *netns.Namespace, addr netip.AddrPort, n int) []netns.Answer {
	t.Helper()
	var out []netns.Answer
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := ns.AskUDP(ctx, addr)
		cancel()
		if err != nil {
			t.Fatalf("udp %s from %s: %v", addr, ns.Name, err)
		}
		out = append(out, a)
	}
	return out
}

// holdServer serves port in each pod's namespace: every line a client
// sends is answered with the pod's name, and connections stay open until
// the client closes them.
func holdServer(t *testing.T, topo *netns.Topology, port uint16, pods ...string) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	for _, name := range pods {
		var l net.Listener
		err := topo.Pods[name].NS.Do(func() (err error) {
			l, err = net.Listen("tcp4", netip.AddrPortFrom(netip.IPv4Unspecified(), port).String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				go echoName(c, name)
			}
		}()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
}

func echoName(c net.Conn, name string) {
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := c.Write([]byte(name + "\n")); err != nil {
			return
		}
	}
}

// holdConn is a client connection to a holdServer.
type holdConn struct {
	conn *net.TCPConn
	r    *bufio.Reader
}

func dialHold(t *testing.T, ns *netns.Namespace, addr netip.AddrPort) *holdConn {
	t.Helper()
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp4", addr.String(), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns.Name, err)
	}
	h := &holdConn{conn: c.(*net.TCPConn), r: bufio.NewReader(c)}
	t.Cleanup(func() { h.conn.Close() })
	return h
}

// ask sends a line and returns the pod that answered.
func (h *holdConn) ask(t *testing.T) string {
	t.Helper()
	if err := h.conn.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatalf("deadline: %v", err)
	}
	if _, err := h.conn.Write([]byte("?\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	line, err := h.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return strings.TrimSpace(line)
}

// reset closes the connection with a TCP reset, which IPVS expires in
// seconds (a FIN would leave it in TIME_WAIT for two minutes).
func (h *holdConn) reset() {
	_ = h.conn.SetLinger(0) // on an open TCP connection it cannot fail
	h.conn.Close()
}
