package conntrack

import (
	"context"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

// TestServingOf lists a UDP service port's destinations with its serving
// endpoints, whatever their readiness and policies; TCP has none.
func TestServingOf(t *testing.T) {
	s := &plan.Service{Key: plan.Key{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: plan.UDP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 53, NodePort: 30053,
		Endpoints: []plan.Endpoint{
			{Address: podA, Port: podPort, Ready: true, Serving: true, ForCluster: true, Weight: 1},
			{Address: podB, Port: podPort, Serving: true, Terminating: true}, // still serving: kept
			{Address: netip.MustParseAddr("10.244.0.13"), Port: podPort},     // neither: its flows go
		}}
	got := ServingOf(s)
	if len(got) != 2 || got[0].Dest != netip.MustParseAddrPort("10.96.0.10:53") || got[1].Dest.Port() != 30053 ||
		got[1].Dest.Addr().IsValid() || len(got[0].Endpoints) != 2 || got[0].Endpoints[1] != podB {
		t.Errorf("ServingOf = %+v", got)
	}
	s.Key.Protocol = plan.TCP
	if got := ServingOf(s); got != nil {
		t.Errorf("TCP: %+v, want none", got)
	}
}

// TestReconcile sets up three clients of one UDP service, each keeping its
// port: one DNATed to a that stays serving, one DNATed to b, which goes
// away while nobody clears it (a restart), and one that got through
// un-NATed before the service had a rule. Reconcile deletes the two stale
// entries and spares the one to a: a restart does not cut it.
func TestReconcile(t *testing.T) {
	topo, vip, other := cluster(t)
	r := newRules(t, topo.Node)
	toA, toB := netip.AddrPortFrom(podA, podPort), netip.AddrPortFrom(podB, podPort)
	otherB := netip.AddrPortFrom(podB, podPort)

	// Before the service has a rule: the datagram leaves un-NATed (another
	// service's DNAT turns connection tracking on).
	r.set(t, r.nat, dnat(other, otherB))
	early := client(t, topo, 40060, vip)
	wantSilence(t, early, "before the service has a rule")

	r.set(t, r.nat, dnat(other, otherB), dnat(vip, toA))
	kept := client(t, topo, 40061, vip)
	wantPod(t, kept, "a", "to a")
	r.set(t, r.nat, dnat(other, otherB), dnat(vip, toB))
	gone := client(t, topo, 40062, vip)
	wantPod(t, gone, "b", "to b")
	elsewhere := client(t, topo, 40063, other)
	wantPod(t, elsewhere, "b", "another service")
	// b goes away: the service is back on a alone.
	r.set(t, r.nat, dnat(other, otherB), dnat(vip, toA))

	c := newCleaner(t, topo.Node)
	n, err := c.Reconcile(testCtx(t), []Serving{{Protocol: plan.UDP, Dest: vip, Endpoints: []netip.Addr{podA}}})
	if err != nil || n != (Deleted{IPv4: 2}) {
		t.Fatalf("Reconcile = %+v, %v; want 2 IPv4 entries (the un-NATed entry and the one to b)", n, err)
	}
	left := entries(t, topo.Node)
	if len(with(left, "-> "+vip.String(), "reply from "+toA.String())) != 1 {
		t.Errorf("the entry to a, a serving endpoint, is gone: %q", left)
	}
	if len(with(left, "-> "+vip.String(), "reply from "+toB.String())) != 0 {
		t.Errorf("the entry to b is left: %q", left)
	}
	if len(with(left, "-> "+other.String())) != 1 {
		t.Errorf("another service's entry went too: %q", left)
	}
	wantPod(t, kept, "a", "the kept flow after Reconcile")
	eventually(t, gone, "a", "the flow that went to b")
	eventually(t, early, "a", "the flow that got through un-NATed")
}

// TestReconcileCountsFamilies reconciles a dual-stack service against the
// fake kernel: two stale IPv4 entries and one stale IPv6 entry go, counted
// in their families; the entries of serving endpoints stay.
func TestReconcileCountsFamilies(t *testing.T) {
	client := func(a string, port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(a), port) }
	gone6 := netip.MustParseAddrPort("[fd00:244::6]:5353")
	entries := []*fakeEntry{
		{proto: unix.IPPROTO_UDP, orig: client("172.30.0.2", 1000), origDst: fakeVIP, replySrc: fakeA, id: 1},
		{proto: unix.IPPROTO_UDP, orig: client("172.30.0.2", 1001), origDst: fakeVIP, replySrc: fakeB, id: 2},
		{proto: unix.IPPROTO_UDP, orig: client("172.30.0.2", 1002), origDst: fakeVIP, replySrc: fakeB, id: 3},
		{proto: unix.IPPROTO_UDP, orig: client("fd00::2", 1003), origDst: fakeVIP6, replySrc: fakeA6, id: 4},
		{proto: unix.IPPROTO_UDP, orig: client("fd00::2", 1004), origDst: fakeVIP6, replySrc: gone6, id: 5},
	}
	k := &fakeKernel{t: t, entries: entries}
	n, err := k.cleaner().Reconcile(context.Background(), []Serving{
		{Protocol: plan.UDP, Dest: fakeVIP, Endpoints: []netip.Addr{fakeA.Addr()}},
		{Protocol: plan.UDP, Dest: fakeVIP6, Endpoints: []netip.Addr{fakeA6.Addr()}},
	})
	k.wg.Wait()
	if err != nil || n != (Deleted{IPv4: 2, IPv6: 1}) || n.Total() != 3 {
		t.Fatalf("Reconcile = %+v (total %d), %v; want 2 IPv4 and 1 IPv6", n, n.Total(), err)
	}
	for _, e := range entries {
		if deleted, want := e.deleteAttributes != nil, e.replySrc == fakeB || e.replySrc == gone6; deleted != want {
			t.Errorf("entry %d (reply from %s): deleted %v, want %v", e.id, e.replySrc, deleted, want)
		}
	}
}
