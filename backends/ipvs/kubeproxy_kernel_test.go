//go:build vm

package ipvs

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// TestKernelRemovesKubeProxy proves the IPVS part of the takeover in the
// VM: kube-proxy's interface kube-ipvs0 (holding a stale cluster IP and
// Weir's own), the virtual servers on its addresses and a node-port one
// of a deleted service go, with kube-proxy's ipsets of both families;
// Weir's virtual servers, on the same cluster IP too, and another
// program's virtual server stay, and Weir's cluster IP still serves.
func TestKernelRemovesKubeProxy(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())
	want := kernelServers(t, b)

	stale := netip.MustParseAddr("10.96.0.50")
	addKubeIPVS0(t, b, stale, vip)
	toB := netip.AddrPortFrom(podB, podPort)
	addForeign(t, b, vsKey{addr: stale, proto: plan.TCP, port: 80}, toB)
	addForeign(t, b, vsKey{addr: topo.NodeIP, proto: plan.TCP, port: 30999}, toB)
	other := vsKey{addr: topo.NodeIP, proto: plan.TCP, port: 80} // not in the node-port range
	addForeign(t, b, other, netip.AddrPortFrom(podC, podPort))
	sets := []string{"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP", "KUBE-NODE-PORT-TCP", "KUBE-6-LOAD-BALANCER-SOURCE-CID"}
	for _, s := range sets {
		createSet(t, b, s)
	}
	mustRemoveKubeProxy(t, b)

	got := kernelServers(t, b)
	want[other.String()] = got[other.String()]
	if !maps.Equal(got, want) {
		t.Errorf("after RemoveKubeProxy the virtual servers are\n%v\nwant Weir's and the other program's:\n%v", got, want)
	}
	b.mu.Lock()
	_, err := b.nl.LinkByName(kubeProxyInterface)
	b.mu.Unlock()
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Errorf("after RemoveKubeProxy: interface %s: %v, want it gone", kubeProxyInterface, err)
	}
	for _, s := range sets {
		b.mu.Lock()
		_, err := b.sets.IpsetList(s)
		b.mu.Unlock()
		if err == nil {
			t.Errorf("after RemoveKubeProxy ipset %s is still there", s)
		}
	}
	netns.WantPods(t, "Weir's cluster IP", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 5), "pod-a")
	mustRemoveKubeProxy(t, b) // nothing left: not an error
}

func mustRemoveKubeProxy(t *testing.T, b *Backend) {
	t.Helper()
	if err := b.RemoveKubeProxy(context.Background()); err != nil {
		t.Fatalf("RemoveKubeProxy: %v", err)
	}
}

// addKubeIPVS0 creates kube-proxy's dummy interface with addrs on it.
func addKubeIPVS0(t *testing.T, b *Backend, addrs ...netip.Addr) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := ensureDummy(b.nl, kubeProxyInterface)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ipn := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
		if err := b.nl.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			t.Fatalf("add %s to %s: %v", a, kubeProxyInterface, err)
		}
	}
}

// createSet creates an ipset named like one of kube-proxy's.
func createSet(t *testing.T, b *Backend, name string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	o := netlink.IpsetCreateOptions{Family: unix.AF_INET}
	if strings.HasPrefix(name, "KUBE-6-") {
		o.Family = unix.AF_INET6
	}
	if err := b.sets.IpsetCreate(name, "hash:ip,port", o); err != nil {
		t.Fatalf("create ipset %s: %v", name, err)
	}
}
