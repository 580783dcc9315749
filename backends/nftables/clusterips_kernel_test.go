package nftables

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// wantRefused checks that a TCP connection from ns to addr is refused at
// once.
func wantRefused(t *testing.T, what string, ns *netns.Namespace, addr netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	a, err := ns.DialTCP(ctx, addr)
	if !errors.Is(err, netns.ErrRefused) {
		t.Errorf("%s: %s from %s: got answer %v, error %v; want connection refused", what, addr, ns.Name, a, err)
	} else if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("%s: %s from %s: refused after %s, want at once", what, addr, ns.Name, d)
	}
}

// TestKernelClusterIPsCheck proves kube-proxy's cluster-IP checks with
// real connections: a port no service serves on a cluster IP is refused at
// once, from outside, from a pod and from the node; an address of the
// service CIDRs that no service has is dropped; the served port still
// works. A service deleted in a partial sync frees its address for the
// drop, and service CIDRs taken away in a sync of their own end it.
func TestKernelClusterIPsCheck(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1))
	other := svc("default", "other", "http", plan.TCP, "10.96.0.20", 80, 0, podEP(podB, 1))
	p := testPlan(web, other)
	p.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	mustSync(t, b, p, backends.FullSync())

	namespaces := []*netns.Namespace{topo.Client, topo.Pods["pod-c"].NS, topo.Node}
	for _, ns := range namespaces {
		wantRefused(t, "an unserved port of a cluster IP", ns, netip.AddrPortFrom(vip, 81))
		wantDropped(t, "an unallocated address of the service CIDRs from "+ns.Name, ns, netip.MustParseAddrPort("10.96.0.99:80"))
		netns.WantPods(t, "the served port from "+ns.Name, netns.DialMany(t, ns, netip.AddrPortFrom(vip, 80), 3), "pod-a")
	}

	delete(p.Services, other.Key)
	mustSync(t, b, p, backends.PartialSync(other.Key))
	wantDropped(t, "the address of a deleted service", topo.Node, netip.MustParseAddrPort("10.96.0.20:80"))
	wantRefused(t, "after another service went", topo.Node, netip.AddrPortFrom(vip, 81))
	wantNoDivergence(t, "read back", b, p)

	// Without the drop the node routes such a packet on (here back to the
	// client, which routes it back: a timeout too), so the set shows it.
	if set := nftOutput(t, b, "list", "set", "ip", "weir", setServiceCIDRs); !strings.Contains(set, "10.96.0.0/16") {
		t.Errorf("the service CIDR is not in its set:\n%s", set)
	}
	p.ServiceCIDRs = nil
	mustSync(t, b, p, backends.PartialSync())
	if set := nftOutput(t, b, "list", "set", "ip", "weir", setServiceCIDRs); strings.Contains(set, "10.96.0.0/16") {
		t.Errorf("service CIDRs taken away in a sync of their own are still in the set:\n%s", set)
	}
	wantRefused(t, "without service CIDRs", topo.Node, netip.AddrPortFrom(vip, 81))
}
