package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Kernel tests: a real node namespace programmed by the backend, pods that
// answer with their name, and real connections.

// The pods of netns.ThreePods, the topology every kernel test here uses.
var podA, podB, podC = netns.PodA, netns.PodB, netns.PodC

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

func podEP(a netip.Addr, weight uint32) plan.Endpoint { return ep(a.String(), podPort, weight) }

func mustSync(t *testing.T, b *Backend, p *plan.Plan, req backends.SyncRequest) {
	t.Helper()
	if err := b.Sync(context.Background(), p, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	nftLists(t, b)
}

var vip = netip.MustParseAddr("10.96.0.10")

func TestKernelClusterIPAndNodePort(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())

	clusterIP := netip.AddrPortFrom(vip, 80)
	answers := netns.DialMany(t, topo.Client, clusterIP, 60)
	netns.WantPods(t, "ClusterIP from the client", answers, "pod-a", "pod-b", "pod-c")
	if src := answers[0].Source.Addr(); src != topo.ClientIP {
		t.Errorf("ClusterIP from the client: pod saw %s, want the client's own %s (no clusterCIDRs, no masquerade)", src, topo.ClientIP)
	}
	netns.WantPods(t, "ClusterIP from the node", netns.DialMany(t, topo.Node, clusterIP, 60), "pod-a", "pod-b", "pod-c")

	nodePort := netip.AddrPortFrom(topo.NodeIP, 30080)
	answers = netns.DialMany(t, topo.Client, nodePort, 60)
	netns.WantPods(t, "NodePort from the client", answers, "pod-a", "pod-b", "pod-c")
	for _, a := range answers {
		if a.Source.Addr() != topo.NodeIP {
			t.Fatalf("NodePort: pod saw %s, want the node's %s (external traffic is masqueraded)", a.Source, topo.NodeIP)
		}
	}
}

func TestKernelHairpin(t *testing.T) {
	topo, b := newCluster(t, Options{})
	// pod-a is the only endpoint, so pod-a → VIP → pod-a.
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())
	for _, a := range netns.DialMany(t, topo.Pods["pod-a"].NS, netip.AddrPortFrom(vip, 80), 5) {
		if a.Pod != "pod-a" || a.Source.Addr() != topo.NodeIP {
			t.Fatalf("hairpin: got %s, want pod-a answering a masqueraded source %s", a, topo.NodeIP)
		}
	}
}

func TestKernelMasqueradeByClusterCIDRs(t *testing.T) {
	topo, b := newCluster(t, Options{Common: backends.Common{ClusterCIDRs: []netip.Prefix{topo0PodCIDR}}})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podB, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())
	addr := netip.AddrPortFrom(vip, 80)
	if a := netns.DialMany(t, topo.Client, addr, 1)[0]; a.Source.Addr() != topo.NodeIP {
		t.Errorf("from outside clusterCIDRs: pod saw %s, want masqueraded to %s", a.Source, topo.NodeIP)
	}
	if a := netns.DialMany(t, topo.Pods["pod-a"].NS, addr, 1)[0]; a.Source.Addr() != podA {
		t.Errorf("from a pod: pod saw %s, want the pod's own %s", a.Source, podA)
	}
}

var topo0PodCIDR = netip.MustParsePrefix("10.244.0.0/16")

func TestKernelNoEndpointsIsRefusedAtOnce(t *testing.T) {
	topo, b := newCluster(t, Options{})
	empty := svc("default", "empty", "http", plan.TCP, vip.String(), 80, 30081)
	mustSync(t, b, testPlan(empty), backends.FullSync())
	for _, addr := range []netip.AddrPort{netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(topo.NodeIP, 30081)} {
		for _, ns := range []*netns.Namespace{topo.Client, topo.Node, topo.Pods["pod-a"].NS} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			_, err := ns.DialTCP(ctx, addr)
			cancel()
			if !errors.Is(err, netns.ErrRefused) {
				t.Errorf("%s from %s: got %v, want connection refused", addr, ns.Name, err)
			} else if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("%s from %s: refused after %s, want at once", addr, ns.Name, d)
			}
		}
	}
}

func TestKernelRemovedEndpointGetsNoTraffic(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())
	addr := netip.AddrPortFrom(vip, 80)
	netns.WantPods(t, "before", netns.DialMany(t, topo.Client, addr, 60), "pod-a", "pod-b", "pod-c")

	smaller := web.Clone()
	smaller.Endpoints = []plan.Endpoint{podEP(podA, 1), podEP(podC, 1)}
	p.Services[web.Key] = smaller
	mustSync(t, b, p, backends.PartialSync(web.Key))
	netns.WantPods(t, "after removing pod-b", netns.DialMany(t, topo.Client, addr, 60), "pod-a", "pod-c")

	swapped := web.Clone()
	swapped.Endpoints = []plan.Endpoint{podEP(podA, 1), podEP(podB, 1)}
	p.Services[web.Key] = swapped
	mustSync(t, b, p, backends.PartialSync(web.Key))
	netns.WantPods(t, "after swapping pod-c for pod-b", netns.DialMany(t, topo.Client, addr, 60), "pod-a", "pod-b")

	delete(p.Services, web.Key)
	mustSync(t, b, p, backends.PartialSync(web.Key))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if a, err := topo.Client.DialTCP(ctx, addr); err == nil {
		t.Errorf("after deleting the service: %s still answered", a.Pod)
	}
}

func TestKernelWeights(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 3), podEP(podB, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())
	const n = 400
	tally := netns.Tally(netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), n))
	// 3:1 over 400 draws: pod-a expects 300 with a standard deviation of ~8.7;
	// 255..345 is more than five deviations either side.
	if tally["pod-a"] < 255 || tally["pod-a"] > 345 || tally["pod-a"]+tally["pod-b"] != n {
		t.Errorf("weights 3:1: got %v, want about 300/100", tally)
	}
}

// TestKernelFailedCommitRebuilds makes a partial sync fail and checks that
// the same Sync rebuilds the tables from scratch and commits the plan.
func TestKernelFailedCommitRebuilds(t *testing.T) {
	logs := &syncbuf.Buffer{}
	topo, b := newCluster(t, Options{Common: backends.Common{Log: slog.New(slog.NewTextHandler(logs, nil))}})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())

	// Make the backend believe it committed a service the kernel never saw:
	// deleting it sends element deletions the kernel rejects, failing the
	// whole transaction, which also carries a real change to web.
	ghost := svc("default", "ghost", "", plan.TCP, "10.96.0.99", 80, 0, podEP(podC, 1))
	v4 := b.tables[0].state
	v4.services[ghost.Key] = newServiceState(ghost, famV4, v4.nodeIP)
	v4.maps[mapID{lane: laneIP, weight: 1}]++
	v4.chains[pickSpec{kind: pickCluster, weight: 1}]++
	moved := web.Clone()
	moved.Endpoints = []plan.Endpoint{podEP(podB, 1)}
	p.Services[web.Key] = moved
	mustSync(t, b, p, backends.PartialSync(ghost.Key, web.Key))
	if !strings.Contains(logs.String(), rebuildLogged) {
		t.Errorf("the failed partial commit was not followed by a logged rebuild; log:\n%s", logs)
	}
	addr := netip.AddrPortFrom(vip, 80)
	netns.WantPods(t, "after the rebuild", netns.DialMany(t, topo.Client, addr, 10), "pod-b")
	if _, ok := b.tables[0].state.services[ghost.Key]; ok {
		t.Error("the rebuilt state still holds the service the kernel never had")
	}
}

// TestKernelFailedRebuildKeepsRules sends a plan the kernel refuses whole
// (two services claiming one node port): the partial commit and the rebuild
// both fail, Sync says so, the last good rules keep serving, and the next
// Sync starts from scratch.
func TestKernelFailedRebuildKeepsRules(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())

	clash := svc("default", "clash", "http", plan.TCP, "10.96.0.11", 80, 30080, podEP(podB, 1))
	p.Services[clash.Key] = clash
	moved := web.Clone()
	moved.Endpoints = []plan.Endpoint{podEP(podC, 1)}
	p.Services[web.Key] = moved
	err := b.Sync(context.Background(), p, backends.PartialSync(clash.Key, web.Key))
	if err == nil || !strings.Contains(err.Error(), "rebuilding the tables from scratch failed too") {
		t.Fatalf("sync of a plan the kernel refuses: got %v, want the commit and the rebuild to fail", err)
	}
	nftLists(t, b) // what the failed sync left must list too
	addr := netip.AddrPortFrom(vip, 80)
	netns.WantPods(t, "after the failed sync", netns.DialMany(t, topo.Client, addr, 10), "pod-a")
	if b.tables[0].synced || b.tables[1].synced {
		t.Error("after a failed rebuild the tables are still marked synced; the next sync would not start from scratch")
	}

	delete(p.Services, clash.Key)
	mustSync(t, b, p, backends.PartialSync(clash.Key))
	netns.WantPods(t, "after the plan is fixed", netns.DialMany(t, topo.Client, addr, 10), "pod-c")
	netns.WantPods(t, "its node port", netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080), 5), "pod-c")
}

// TestKernelOneChangeTouchesOneService watches the kernel's own change
// notifications while one endpoint of one service among many is replaced:
// the transaction must carry that service's elements and nothing else.
func TestKernelOneChangeTouchesOneService(t *testing.T) {
	topo, b := newCluster(t, Options{})
	p := testPlan()
	var keys []plan.Key
	for i := range 50 {
		s := svc("default", "svc-"+string(rune('a'+i/26))+string(rune('a'+i%26)), "http", plan.TCP,
			netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}).String(), 80, uint16(30100+i), podEP(podA, 1), podEP(podB, 1))
		p.Services[s.Key] = s
		keys = append(keys, s.Key)
	}
	mustSync(t, b, p, backends.FullSync())

	events := watchElements(t, topo)
	changedKey := keys[17]
	changed := p.Services[changedKey].Clone()
	changed.Endpoints[1] = podEP(podC, 1)
	p.Services[changedKey] = changed
	mustSync(t, b, p, backends.PartialSync(changedKey))

	st := b.tables[0].state.services[changedKey]
	entries := [][]byte{ipKey(st.ips[0], st.proto, st.port), portKey(st.proto, st.nodePort)}
	got := <-events
	if len(got) == 0 {
		t.Fatal("saw no element changes for the one-service transaction")
	}
	for _, ev := range got {
		if !ev.bucketOf(entries...) && !ev.hairpinOf(podB, podC) {
			t.Errorf("transaction touched %s, which is not service %s", ev, changedKey)
		}
	}
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, 17}), 80)
	netns.WantPods(t, "changed service", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-c")
	other := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, 18}), 80)
	netns.WantPods(t, "untouched neighbour", netns.DialMany(t, topo.Client, other, 40), "pod-a", "pod-b")
}

// policyEP is a pod endpoint with the traffic sets the planner chose.
func policyEP(a netip.Addr, forCluster, forLocal bool) plan.Endpoint {
	e := podEP(a, 1)
	e.ForCluster, e.ForLocal, e.Local = forCluster, forLocal, forLocal
	return e
}

// wantDropped checks that connecting times out: the packet is dropped, not
// rejected.
func wantDropped(t *testing.T, what string, ns *netns.Namespace, addr netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	a, err := ns.DialTCP(ctx, addr)
	if !errors.Is(err, netns.ErrTimeout) {
		t.Errorf("%s: got answer %v, error %v; want the connection dropped (timeout)", what, a, err)
	}
}

func TestKernelExternalTrafficPolicyLocal(t *testing.T) {
	topo, b := newCluster(t, Options{})
	local := svc("default", "local", "http", plan.TCP, vip.String(), 80, 30090,
		policyEP(podA, true, true), policyEP(podB, true, false))
	local.ExternalLocal = true
	nowhere := svc("default", "nowhere", "http", plan.TCP, "10.96.0.11", 80, 30091, policyEP(podB, true, false))
	nowhere.ExternalLocal = true
	mustSync(t, b, testPlan(local, nowhere), backends.FullSync())

	answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30090), 30)
	netns.WantPods(t, "NodePort with externalTrafficPolicy Local", answers, "pod-a")
	for _, a := range answers {
		if a.Source.Addr() != topo.ClientIP {
			t.Fatalf("externalTrafficPolicy Local: pod saw %s, want the client's own %s", a.Source, topo.ClientIP)
		}
	}
	netns.WantPods(t, "its ClusterIP", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 40), "pod-a", "pod-b")
	wantDropped(t, "NodePort without local endpoints", topo.Client, netip.AddrPortFrom(topo.NodeIP, 30091))
	netns.WantPods(t, "ClusterIP of the service without local endpoints",
		netns.DialMany(t, topo.Client, netip.AddrPortFrom(netip.MustParseAddr("10.96.0.11"), 80), 5), "pod-b")
}

func TestKernelInternalTrafficPolicyLocal(t *testing.T) {
	topo, b := newCluster(t, Options{})
	local := svc("default", "local", "http", plan.TCP, vip.String(), 80, 0,
		policyEP(podA, false, true), policyEP(podB, false, false))
	local.InternalLocal = true
	nowhere := svc("default", "nowhere", "http", plan.TCP, "10.96.0.11", 80, 0, policyEP(podB, false, false))
	nowhere.InternalLocal = true
	mustSync(t, b, testPlan(local, nowhere), backends.FullSync())

	netns.WantPods(t, "internalTrafficPolicy Local", netns.DialMany(t, topo.Pods["pod-c"].NS, netip.AddrPortFrom(vip, 80), 30), "pod-a")
	wantDropped(t, "internalTrafficPolicy Local without local endpoints", topo.Pods["pod-c"].NS, netip.AddrPortFrom(netip.MustParseAddr("10.96.0.11"), 80))
}

func TestKernelExternalAndLoadBalancerIPs(t *testing.T) {
	topo, b := newCluster(t, Options{})
	extIP, lbIP := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("198.51.100.5")
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1), podEP(podB, 1))
	web.ExternalIPs = []netip.Addr{extIP}
	web.LoadBalancerIPs = []netip.Addr{lbIP}
	mustSync(t, b, testPlan(web), backends.FullSync())
	for _, ip := range []netip.Addr{extIP, lbIP} {
		answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(ip, 80), 40)
		netns.WantPods(t, ip.String(), answers, "pod-a", "pod-b")
		if src := answers[0].Source.Addr(); src != topo.NodeIP {
			t.Errorf("%s: pod saw %s, want masqueraded to %s (externalTrafficPolicy Cluster)", ip, src, topo.NodeIP)
		}
	}

	// With externalTrafficPolicy Local: only local endpoints, client address kept.
	local := web.Clone()
	local.ExternalLocal = true
	local.Endpoints = []plan.Endpoint{policyEP(podA, true, true), policyEP(podB, true, false)}
	p := testPlan(local)
	mustSync(t, b, p, backends.PartialSync(web.Key))
	answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(lbIP, 80), 20)
	netns.WantPods(t, "load-balancer IP, Local policy", answers, "pod-a")
	if src := answers[0].Source.Addr(); src != topo.ClientIP {
		t.Errorf("Local policy: pod saw %s, want the client's %s", src, topo.ClientIP)
	}
}

func TestKernelSessionAffinity(t *testing.T) {
	topo, b := newCluster(t, Options{})
	sticky := svc("default", "sticky", "http", plan.TCP, vip.String(), 80, 30095, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	other := svc("default", "other", "http", plan.TCP, "10.96.0.11", 80, 0, podEP(podA, 1))
	p := testPlan(sticky, other)
	mustSync(t, b, p, backends.FullSync())

	addr := netip.AddrPortFrom(vip, 80)
	first := netns.DialMany(t, topo.Client, addr, 1)[0].Pod
	netns.WantPods(t, "client with affinity", netns.DialMany(t, topo.Client, addr, 20), first)

	// An unrelated partial sync and a periodic full sync keep the affinity.
	changed := other.Clone()
	changed.Endpoints = []plan.Endpoint{podEP(podB, 1)}
	p.Services[other.Key] = changed
	mustSync(t, b, p, backends.PartialSync(other.Key))
	netns.WantPods(t, "after an unrelated partial sync", netns.DialMany(t, topo.Client, addr, 10), first)
	mustSync(t, b, p, backends.FullSync())
	netns.WantPods(t, "after a periodic full sync", netns.DialMany(t, topo.Client, addr, 10), first)
	netns.WantPods(t, "the NodePort shares the affinity", netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30095), 10), first)

	// Like kube-proxy: another endpoint leaving keeps the client where it
	// is; its own endpoint leaving sends it to one that stays, for good.
	pods := map[string]netip.Addr{"pod-a": podA, "pod-b": podB, "pod-c": podC}
	without := func(pod string) {
		t.Helper()
		cur := p.Services[sticky.Key].Clone()
		cur.Endpoints = slices.DeleteFunc(cur.Endpoints, func(e plan.Endpoint) bool { return e.Address == pods[pod] })
		p.Services[sticky.Key] = cur
		mustSync(t, b, p, backends.PartialSync(sticky.Key))
	}
	for pod := range pods {
		if pod != first {
			without(pod)
			break
		}
	}
	netns.WantPods(t, "after another endpoint left", netns.DialMany(t, topo.Client, addr, 10), first)
	without(first)
	next := netns.DialMany(t, topo.Client, addr, 1)[0].Pod
	if next == first {
		t.Fatalf("the client still reaches %s, which left the service", first)
	}
	netns.WantPods(t, "after its own endpoint left", netns.DialMany(t, topo.Client, addr, 10), next)
}

func TestKernelLoadBalancerSourceRanges(t *testing.T) {
	topo, b := newCluster(t, Options{})
	lbIP := netip.MustParseAddr("198.51.100.5")
	shop := svc("default", "shop", "https", plan.TCP, vip.String(), 443, 0, podEP(podB, 1))
	shop.LoadBalancerIPs = []netip.Addr{lbIP}
	shop.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	p := testPlan(shop)
	mustSync(t, b, p, backends.FullSync())
	lb := netip.AddrPortFrom(lbIP, 443)
	netns.WantPods(t, "load-balancer IP from an allowed range", netns.DialMany(t, topo.Pods["pod-a"].NS, lb, 3), "pod-b")
	wantDropped(t, "load-balancer IP from outside the ranges", topo.Client, lb)
	wantDropped(t, "load-balancer IP from the node, outside the ranges", topo.Node, lb)
	netns.WantPods(t, "the cluster IP is not limited", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 443), 3), "pod-b")

	open := shop.Clone()
	open.SourceRanges = append(open.SourceRanges, netip.MustParsePrefix("172.30.0.0/24"))
	p.Services[shop.Key] = open
	mustSync(t, b, p, backends.PartialSync(shop.Key))
	netns.WantPods(t, "after allowing the client's range", netns.DialMany(t, topo.Client, lb, 3), "pod-b")
	netns.WantPods(t, "after allowing the node's range", netns.DialMany(t, topo.Node, lb, 3), "pod-b")
}

func TestKernelLocalDetectors(t *testing.T) {
	for _, mode := range []backends.LocalDetector{backends.DetectNodeCIDR, backends.DetectInterfaceNamePrefix} {
		t.Run(string(mode), func(t *testing.T) {
			topo, _ := newCluster(t, Options{})
			opts := Options{Common: backends.Common{NetNS: topo.Node.Fd(), LocalDetector: mode,
				PodInterfacePrefix: strings.TrimRight(topo.Pods["pod-a"].Link, "0123456789")}}
			b, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			p := testPlan(svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podB, 1)))
			p.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
			mustSync(t, b, p, backends.FullSync())
			addr := netip.AddrPortFrom(vip, 80)
			if a := netns.DialMany(t, topo.Client, addr, 1)[0]; a.Source.Addr() != topo.NodeIP {
				t.Errorf("from the client: pod saw %s, want masqueraded to %s", a.Source, topo.NodeIP)
			}
			if a := netns.DialMany(t, topo.Pods["pod-a"].NS, addr, 1)[0]; a.Source.Addr() != podA {
				t.Errorf("from a pod: pod saw %s, want the pod's own %s", a.Source, podA)
			}
		})
	}
}

func TestKernelLocalhostNodePort(t *testing.T) {
	topo, _ := newCluster(t, Options{})
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), LocalhostNodePorts: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1), podEP(podB, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())
	answers := netns.DialMany(t, topo.Node, netip.MustParseAddrPort("127.0.0.1:30080"), 20)
	netns.WantPods(t, "NodePort on 127.0.0.1 from the node", answers, "pod-a", "pod-b")
	if src := answers[0].Source.Addr(); src.IsLoopback() {
		t.Errorf("pod saw the loopback source %s; want it masqueraded", src)
	}
}

func TestKernelNodePortPrimaryAddresses(t *testing.T) {
	topo, _ := newCluster(t, Options{})
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), NodePortPrimary: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := testPlan(svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1)))
	mustSync(t, b, p, backends.FullSync())
	addr := netip.AddrPortFrom(topo.NodeIP, 30080)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if a, err := topo.Client.DialTCP(ctx, addr); err == nil {
		t.Errorf("before the node lists %s: %s answered; want no NodePort on an address the Node does not list", topo.NodeIP, a.Pod)
	}
	p.Node.Addresses = []netip.Addr{topo.NodeIP}
	mustSync(t, b, p, backends.PartialSync())
	netns.WantPods(t, "NodePort on the node's primary address", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
}

// TestKernelSCTPRulesAccepted programs an SCTP service. This kernel has no
// SCTP sockets, so no SCTP traffic is sent; the kernel must still accept the
// service's elements and keep TCP services working beside it.
func TestKernelSCTPRulesAccepted(t *testing.T) {
	topo, b := newCluster(t, Options{})
	sig := svc("default", "sig", "sctp", plan.SCTP, vip.String(), 3868, 30868, podEP(podA, 1))
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podB, 1))
	mustSync(t, b, testPlan(sig, web), backends.FullSync())
	netns.WantPods(t, "TCP beside SCTP on one cluster IP", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 3), "pod-b")
}

func TestKernelDualStack(t *testing.T) {
	topo := netns.NewThreePods(t, netns.DualStack("pod-a", "pod-b"))
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd()}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	vip6 := netip.MustParseAddr("fd00:10:96::10")
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080,
		podEP(podA, 1), podEP(podB, 1), ep(netns.PodA6.String(), podPort, 1), ep(netns.PodB6.String(), podPort, 1))
	web.ClusterIPs = append(web.ClusterIPs, vip6)
	only6 := svc("default", "only6", "http", plan.TCP, "fd00:10:96::11", 80, 0, ep(netns.PodB6.String(), podPort, 1))
	empty6 := svc("default", "empty6", "http", plan.TCP, "fd00:10:96::12", 80, 0)
	mustSync(t, b, testPlan(web, only6, empty6), backends.FullSync())

	answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip6, 80), 40)
	netns.WantPods(t, "IPv6 cluster IP from the client", answers, "pod-a", "pod-b")
	if src := answers[0].Source.Addr(); src != topo.ClientIP6 {
		t.Errorf("IPv6 cluster IP: pod saw %s, want the client's %s", src, topo.ClientIP6)
	}
	netns.WantPods(t, "IPv4 cluster IP of the same service", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 20), "pod-a", "pod-b")
	netns.WantPods(t, "IPv6 cluster IP from the node", netns.DialMany(t, topo.Node, netip.AddrPortFrom(vip6, 80), 20), "pod-a", "pod-b")
	answers = netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP6, 30080), 20)
	netns.WantPods(t, "NodePort on the node's IPv6 address", answers, "pod-a", "pod-b")
	if src := answers[0].Source.Addr(); src != topo.NodeIP6 {
		t.Errorf("IPv6 NodePort: pod saw %s, want masqueraded to %s", src, topo.NodeIP6)
	}
	netns.WantPods(t, "IPv6-only service", netns.DialMany(t, topo.Client, netip.MustParseAddrPort("[fd00:10:96::11]:80"), 5), "pod-b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := topo.Client.DialTCP(ctx, netip.MustParseAddrPort("[fd00:10:96::12]:80")); !errors.Is(err, netns.ErrRefused) {
		t.Errorf("IPv6 service without endpoints: got %v, want refused", err)
	}
	// Hairpin over IPv6: pod-b is the only endpoint of only6.
	if a := netns.DialMany(t, topo.Pods["pod-b"].NS, netip.MustParseAddrPort("[fd00:10:96::11]:80"), 1)[0]; a.Pod != "pod-b" || a.Source.Addr() == netns.PodB6 {
		t.Errorf("IPv6 hairpin: got %s, want pod-b answering a masqueraded source", a)
	}
}

// TestKernelNoEndpointsOnlyOnNodePortAddresses checks that a node port
// without endpoints is refused only where node ports are served: on
// another local address the port belongs to the node's own listener.
func TestKernelNoEndpointsOnlyOnNodePortAddresses(t *testing.T) {
	topo, _ := newCluster(t, Options{})
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), NodePortCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	listenOnNode(t, topo, 30081)
	mustSync(t, b, testPlan(svc("default", "empty", "http", plan.TCP, vip.String(), 80, 30081)), backends.FullSync())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if a, err := topo.Client.DialTCP(ctx, netip.AddrPortFrom(topo.NodeIP, 30081)); !errors.Is(err, netns.ErrRefused) {
		t.Errorf("node port without endpoints on a node-port address: got %v, %v; want refused", a, err)
	}
	a, err := topo.Node.DialTCP(ctx, netip.MustParseAddrPort("127.0.0.1:30081"))
	if err != nil || a.Pod != "node" {
		t.Errorf("the same port on 127.0.0.1, not a node-port address: got %v, %v; want the node's own listener", a, err)
	}
}

// listenOnNode serves TCP port on every address of the node, answering
// like a pod named "node".
func listenOnNode(t *testing.T, topo *netns.Topology, port uint16) {
	t.Helper()
	var l net.Listener
	err := topo.Node.Do(func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
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
			fmt.Fprintf(c, "node %s\n", c.RemoteAddr())
			c.Close()
		}
	}()
}

// TestKernelOverlappingRanges gives interval sets ranges that overlap
// (one inside another, or twice the same): the kernel refuses overlapping
// intervals, which failed every commit of the node, so the backend must
// write only the ranges that cover the others.
func TestKernelOverlappingRanges(t *testing.T) {
	topo, _ := newCluster(t, Options{})
	wide, inner := netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("172.30.0.0/24")
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(),
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.1.0/24")},
		NodePortCIDRs: []netip.Prefix{wide, inner, wide}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lbIP := netip.MustParseAddr("198.51.100.5")
	shop := svc("default", "shop", "https", plan.TCP, vip.String(), 443, 30443, podEP(podB, 1))
	shop.LoadBalancerIPs = []netip.Addr{lbIP}
	shop.SourceRanges = []netip.Prefix{wide, inner, netip.MustParsePrefix("172.30.0.2/32"), wide}
	p := testPlan(shop)
	mustSync(t, b, p, backends.FullSync())
	netns.WantPods(t, "load-balancer IP from an allowed range", netns.DialMany(t, topo.Client, netip.AddrPortFrom(lbIP, 443), 3), "pod-b")
	netns.WantPods(t, "node port", netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30443), 3), "pod-b")
	wantNoDivergence(t, "read back", b, p)

	narrower := shop.Clone()
	narrower.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}
	p.Services[shop.Key] = narrower
	mustSync(t, b, p, backends.PartialSync(shop.Key))
	wantDropped(t, "load-balancer IP after its ranges left the client out", topo.Client, netip.AddrPortFrom(lbIP, 443))
	wantNoDivergence(t, "read back after the partial sync", b, p)
}
