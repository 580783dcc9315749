package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

var (
	podA = netip.MustParseAddr("10.244.0.11")
	podB = netip.MustParseAddr("10.244.0.12")
)

const (
	servicePort = 53
	nodePort    = 30053
	podPort     = 5353
)

// cluster builds the node with pods a and b answering UDP on podPort and
// returns it with the service VIP and a second VIP for another service.
func cluster(t *testing.T) (topo *netns.Topology, vip, other netip.AddrPort) {
	topo = netns.NewT(t, netns.Options{Pods: []netns.PodSpec{
		{Name: "a", IP: podA, Ports: []uint16{podPort}},
		{Name: "b", IP: podB, Ports: []uint16{podPort}},
	}})
	first := topo.ServiceCIDR.Addr().Next()
	return topo, netip.AddrPortFrom(first, servicePort), netip.AddrPortFrom(first.Next(), servicePort)
}

// client opens a UDP socket in the client namespace that keeps its local
// port, so every exchange is one conntrack entry in the node.
func client(t *testing.T, topo *netns.Topology, port uint16, remote netip.AddrPort) *netns.UDPConn {
	t.Helper()
	c, err := topo.Client.DialUDP(netip.AddrPortFrom(topo.ClientIP, port), remote)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// silence is how long a probe waits before calling a service silent.
const silence = 300 * time.Millisecond

// ask sends one probe and waits at most d for the answer.
func ask(c *netns.UDPConn, d time.Duration) (netns.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Ask(ctx)
}

// wantPod fails the test unless pod answers c's next probe.
func wantPod(t *testing.T, c *netns.UDPConn, pod, why string) {
	t.Helper()
	if a, err := ask(c, 2*time.Second); err != nil || a.Pod != pod {
		t.Fatalf("%s: %s got %v, %v; want pod %s", why, c.LocalAddr(), a, err, pod)
	}
}

// wantSilence fails the test unless c's next probe goes unanswered.
func wantSilence(t *testing.T, c *netns.UDPConn, why string) {
	t.Helper()
	if a, err := ask(c, silence); !errors.Is(err, netns.ErrTimeout) {
		t.Fatalf("%s: %s got %v, %v; want no answer", why, c.LocalAddr(), a, err)
	}
}

// eventually polls c until pod answers, or fails the test at the deadline.
func eventually(t *testing.T, c *netns.UDPConn, pod, why string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, err := ask(c, 200*time.Millisecond)
		if err == nil && a.Pod == pod {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s still gets %v, %v; want pod %s", why, c.LocalAddr(), a, err, pod)
		}
	}
}

// newCleaner returns a Cleaner for ns, closed when the test ends.
func newCleaner(t *testing.T, ns *netns.Namespace) *Cleaner {
	t.Helper()
	c, err := New(ns.Fd(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// with returns the entries that contain every one of parts.
func with(entries []string, parts ...string) []string {
	return slices.DeleteFunc(slices.Clone(entries), func(e string) bool {
		return slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(e, p) })
	})
}

// TestClearRemovedEndpoint is rule 1: an endpoint goes away, and a client
// that keeps its port keeps reaching it through its conntrack entry until
// the entry is deleted.
func TestClearRemovedEndpoint(t *testing.T) {
	topo, vip, other := cluster(t)
	np := netip.AddrPortFrom(topo.NodeIP, nodePort)
	r := newRules(t, topo.Node)
	toA, toB := netip.AddrPortFrom(podA, podPort), netip.AddrPortFrom(podB, podPort)
	r.set(t, r.nat, dnat(vip, toA), dnat(np, toA))

	viaVIP, viaNodePort := client(t, topo, 40053, vip), client(t, topo, 40054, np)
	wantPod(t, viaVIP, "a", "VIP to a")
	wantPod(t, viaNodePort, "a", "node port to a")

	// The service's only endpoint moves from a to b.
	r.set(t, r.nat, dnat(vip, toB), dnat(np, toB))
	if a, err := topo.Client.AskUDP(testCtx(t), vip); err != nil || a.Pod != "b" {
		t.Fatalf("new client after the change: got %v, %v; want pod b", a, err)
	}
	for range 3 {
		wantPod(t, viaVIP, "a", "stale entry, VIP")
		wantPod(t, viaNodePort, "a", "stale entry, node port")
	}

	c := newCleaner(t, topo.Node)
	miss := []Flow{
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(vip.Addr(), servicePort+1), Endpoint: podA},
		{Protocol: plan.UDP, Dest: other, Endpoint: podA},
		{Protocol: plan.UDP, Dest: vip, Endpoint: netip.MustParseAddr("10.244.0.99")},
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, nodePort+1), Endpoint: podA},
		{Protocol: plan.SCTP, Dest: vip, Endpoint: podA},
	}
	if n, err := c.Clear(testCtx(t), miss); n != 0 || err != nil {
		t.Fatalf("Clear(flows that match nothing) = %d, %v; want 0, nil", n, err)
	}
	wantPod(t, viaVIP, "a", "after clearing other flows")

	n, err := c.Clear(testCtx(t), []Flow{
		{Protocol: plan.UDP, Dest: vip, Endpoint: podA},
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, nodePort), Endpoint: podA},
	})
	if err != nil || n < 2 {
		t.Fatalf("Clear = %d, %v; want at least 2 (VIP and node port)", n, err)
	}
	left := entries(t, topo.Node)
	if stale := with(left, "reply from "+toA.String()); len(stale) > 0 {
		t.Errorf("entries to a left after Clear: %q", stale)
	}
	if fresh := with(left, "reply from "+toB.String()); len(fresh) == 0 {
		t.Errorf("Clear deleted the new client's entry to b too: %q", left)
	}
	eventually(t, viaVIP, "b", "VIP after Clear")
	eventually(t, viaNodePort, "b", "node port after Clear")
}

// TestClearFirstEndpoint is rule 2: traffic that reached the VIP before it
// had any DNAT left an entry without NAT, which keeps bypassing the DNAT
// added for the service's first endpoint until it is deleted.
func TestClearFirstEndpoint(t *testing.T) {
	topo, vip, other := cluster(t)
	r := newRules(t, topo.Node)
	// Another service's DNAT turns connection tracking on, as a proxy's
	// rules always do; this service's VIP has no rule yet.
	toOther := dnat(other, netip.AddrPortFrom(podB, podPort))
	r.set(t, r.nat, toOther)
	c := client(t, topo, 40053, vip)

	// A service without endpoints has its traffic dropped in a filter
	// hook. The kernel confirms an entry only when the packet leaves the
	// hooks, so a dropped (or rejected) datagram leaves nothing behind.
	r.set(t, r.forward, drop(vip))
	wantSilence(t, c, "dropped")
	if got := with(entries(t, topo.Node), vip.String()); len(got) > 0 {
		t.Fatalf("a dropped datagram left entries: %q", got)
	}

	// Before the VIP has any rule the datagram is routed on un-NATed (and
	// dies beyond the node): that leaves an unreplied entry without NAT.
	r.set(t, r.forward)
	wantSilence(t, c, "VIP without rules")
	if got := with(entries(t, topo.Node), vip.String(), "reply from "+vip.String()); len(got) != 1 {
		t.Fatalf("want one un-NATed entry to %s, got %q", vip, got)
	}

	// The first endpoint arrives.
	r.set(t, r.nat, toOther, dnat(vip, netip.AddrPortFrom(podA, podPort)))
	if a, err := topo.Client.AskUDP(testCtx(t), vip); err != nil || a.Pod != "a" {
		t.Fatalf("new client after the DNAT: got %v, %v; want pod a", a, err)
	}
	wantSilence(t, c, "stale un-NATed entry")

	n, err := newCleaner(t, topo.Node).Clear(testCtx(t), []Flow{{Protocol: plan.UDP, Dest: vip}})
	if err != nil || n < 1 {
		t.Fatalf("Clear = %d, %v; want at least 1", n, err)
	}
	eventually(t, c, "a", "after Clear")
}
