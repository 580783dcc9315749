package conntrack

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// echoPort is where the pods' echo servers listen.
const echoPort = 7000

// dnatTCP is `ip daddr A tcp dport P dnat to B:Q`.
func dnatTCP(dst, to netip.AddrPort) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, dst.Port())},
		&expr.Immediate{Register: 1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// echoClient opens TCP connections from the client namespace and checks
// that each echoes a line.
type echoClient struct {
	t    *testing.T
	topo *netns.Topology
}

// open connects to addr and exchanges one line; the connection closes
// when the test ends.
func (ec echoClient) open(addr netip.AddrPort) net.Conn {
	ec.t.Helper()
	var c net.Conn
	err := ec.topo.Client.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", addr.String())
		return err
	})
	if err != nil {
		ec.t.Fatalf("dial %s: %v", addr, err)
	}
	ec.t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	msg := fmt.Sprintf("hello from %s\n", c.LocalAddr())
	if _, err := io.WriteString(c, msg); err != nil {
		ec.t.Fatal(err)
	}
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != msg {
		ec.t.Fatalf("echo through %s: %q, %v; want %q", addr, got, err, msg)
	}
	return c
}

// openClosed opens a connection to addr and closes it from both ends:
// the client's FIN out, then the server's FIN back, read as EOF. It
// returns the client's address, the original source of its entry.
func (ec echoClient) openClosed(addr netip.AddrPort) netip.AddrPort {
	ec.t.Helper()
	c := ec.open(addr)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		ec.t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
		ec.t.Fatalf("after the client's FIN: read %d bytes, %v; want EOF", n, err)
	}
	c.Close()
	return c.LocalAddr().(*net.TCPAddr).AddrPort()
}

// awaitTimeWait polls the node's table until the entries from each of
// from are in TIME_WAIT, or fails the test at the deadline.
func awaitTimeWait(t *testing.T, ns *netns.Namespace, from ...netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		states := tcpStates(t, ns)
		waiting := 0
		for _, f := range from {
			if states[f] == tcpTimeWait {
				waiting++
			}
		}
		if waiting == len(from) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("entries from %v not in TIME_WAIT: states %v", from, states)
		}
	}
}

// tcpStates returns the TCP state of each entry of ns by original source.
func tcpStates(t *testing.T, ns *netns.Namespace) map[netip.AddrPort]uint8 {
	t.Helper()
	out := map[netip.AddrPort]uint8{}
	dumpEntries(t, ns, func(e entry) {
		if e.orig.proto == unix.IPPROTO_TCP {
			out[e.orig.src] = e.tcpState
		}
	})
	return out
}

// TestLoadRealConnections holds TCP connections open through a DNAT to
// pod a and closes others: Read counts the open ones as active, the
// closed ones (TIME_WAIT) only as tracked, nothing for pod b or for a
// connection to a's own address, and on a second read counts as new just
// the connections opened in between, closed or not.
func TestLoadRealConnections(t *testing.T) {
	topo, vip, _ := cluster(t)
	vip = netip.AddrPortFrom(vip.Addr(), 80)
	for _, p := range []string{"a", "b"} {
		e, err := netns.StartEcho(topo.Pods[p], echoPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
	}
	r := newRules(t, topo.Node)
	r.set(t, r.nat, dnatTCP(vip, netip.AddrPortFrom(podA, echoPort)))
	ec := echoClient{t: t, topo: topo}
	for range 3 {
		ec.open(vip)
	}
	ec.open(netip.AddrPortFrom(podA, echoPort)) // not through the service
	awaitTimeWait(t, topo.Node, ec.openClosed(vip), ec.openClosed(vip))

	l := NewLoad(newCleaner(t, topo.Node), Limits{})
	serving := []Serving{{Protocol: plan.TCP, Dest: vip, Endpoints: []netip.Addr{podA, podB}}}
	rep, err := l.Read(testCtx(t), serving)
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Dests[0]
	if d.Endpoints[0] != (EndpointLoad{Tracked: 5, Active: 3}) || d.Endpoints[1] != (EndpointLoad{}) || d.Stale != (EndpointLoad{}) ||
		rep.Truncated || !rep.Since.IsZero() {
		t.Fatalf("first read: a %+v, b %+v, stale %+v, truncated %v; want a 5 tracked, 3 active, nothing else",
			d.Endpoints[0], d.Endpoints[1], d.Stale, rep.Truncated)
	}

	counts, err := newCleaner(t, topo.Node).Count(testCtx(t), serving)
	if err != nil || counts[0].ByEndpoint[podA] != 5 || counts[0].Active[podA] != 3 || len(counts[0].ByEndpoint) != 1 {
		t.Fatalf("Count = %+v, %v; want a 5 (3 active)", counts, err)
	}

	ec.open(vip)
	ec.open(vip)
	awaitTimeWait(t, topo.Node, ec.openClosed(vip))
	rep, err = l.Read(testCtx(t), serving)
	if err != nil {
		t.Fatal(err)
	}
	if d := rep.Dests[0]; d.Endpoints[0] != (EndpointLoad{Tracked: 8, Active: 5, New: 3}) || d.Endpoints[1] != (EndpointLoad{}) || rep.Since.IsZero() {
		t.Fatalf("second read: a %+v, b %+v, since %v; want a 8 tracked, 5 active, 3 new (two open, one closed)",
			d.Endpoints[0], d.Endpoints[1], rep.Since)
	}

	// Signals sums the same counts per endpoint of a plan service, after
	// one more connection.
	ec.open(vip)
	svc := &plan.Service{Key: plan.Key{Namespace: "default", Name: "echo", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{vip.Addr()}, Port: vip.Port(),
		Endpoints: []plan.Endpoint{{Address: podA, Port: echoPort}, {Address: podB, Port: echoPort}}}
	sigs, err := l.Signals(testCtx(t), []*plan.Service{svc})
	if err != nil {
		t.Fatal(err)
	}
	if want := []abi.Signals{{Active: 6, New: 1}, {}}; !slices.Equal(sigs[0], want) {
		t.Errorf("Signals = %v, want %v", sigs[0], want)
	}
}
