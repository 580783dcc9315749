//go:build vm

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

func TestKernelTCPAndUDPThroughClusterIPAndNodePort(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	dns := service("dns", plan.UDP, 53, 30053, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	mustSync(t, b, testPlan(web, dns), backends.FullSync())

	answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 30)
	netns.WantPods(t, "TCP cluster IP from the client", answers, "pod-a", "pod-b", "pod-c")
	if src := answers[0].Source.Addr(); src != topo.ClientIP {
		t.Errorf("TCP cluster IP: pod saw %s, want the client's %s (no masquerade in phase 1)", src, topo.ClientIP)
	}
	netns.WantPods(t, "TCP node port from the client",
		netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080), 30), "pod-a", "pod-b", "pod-c")
	netns.WantPods(t, "TCP cluster IP from the node",
		netns.DialMany(t, topo.Node, netip.AddrPortFrom(vip, 80), 30), "pod-a", "pod-b", "pod-c")
	netns.WantPods(t, "UDP cluster IP from the client",
		askUDPMany(t, topo.Client, netip.AddrPortFrom(vip, 53), 30), "pod-a", "pod-b", "pod-c")
	netns.WantPods(t, "UDP node port from the client",
		askUDPMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30053), 30), "pod-a", "pod-b", "pod-c")

	got := kernelServers(t, b)
	for _, k := range []string{"TCP 10.96.0.10:80", "UDP 10.96.0.10:53", "TCP 172.30.0.1:30080", "UDP 172.30.0.1:30053"} {
		if got[k] != "rr 10.244.0.11:8080 w1 10.244.0.12:8080 w1 10.244.0.13:8080 w1" {
			t.Errorf("virtual server %s: got %q", k, got[k])
		}
	}
	if len(got) != 4 {
		t.Errorf("kernel has %d virtual servers, want 4: %v", len(got), got)
	}
	wantLinkAddrs(t, b, vip)
}

// wantLinkAddrs checks the addresses on the backend's dummy interface.
func wantLinkAddrs(t *testing.T, b *Backend, want ...netip.Addr) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := b.nl.LinkByName(b.opts.Interface)
	if err != nil {
		t.Fatal(err)
	}
	got, err := linkAddrs(b.nl, l)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	if !slices.Equal(got, want) || l.Attrs().Flags&(1<<0) == 0 {
		t.Errorf("interface %s: addresses %v (flags %v), want %v and up", b.opts.Interface, got, l.Attrs().Flags, want)
	}
}

func TestKernelEverySchedulerIsAccepted(t *testing.T) {
	topo, b := newCluster(t, Options{Scheduler: "wlc"})
	p := testPlan()
	for i, s := range append([]string{""}, Schedulers...) {
		svc := service("s-"+s, plan.TCP, 80, 0, []string{fmt.Sprintf("10.96.1.%d", i+1)}, podEP(podA, 1), podEP(podB, 2))
		svc.Scheduler = plan.Scheduler(s)
		p.Services[svc.Key] = svc
	}
	mustSync(t, b, p, backends.FullSync())
	got := kernelServers(t, b)
	for i, s := range append([]string{"wlc"}, Schedulers...) {
		k := fmt.Sprintf("TCP 10.96.1.%d:80", i+1)
		if want := s + " 10.244.0.11:8080 w1 10.244.0.12:8080 w2"; got[k] != want {
			t.Errorf("%s: kernel has %q, want %q", k, got[k], want)
		}
		netns.DialMany(t, topo.Client, netip.MustParseAddrPort(k[4:]), 1)
	}
}

// within4Sigma checks a binomial count: n draws with probability q.
func within4Sigma(t *testing.T, what string, got, n int, q float64) {
	t.Helper()
	mean := float64(n) * q
	sigma := 4 * sqrt(mean*(1-q))
	if float64(got) < mean-sigma || float64(got) > mean+sigma {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f", what, got, n, mean, sigma)
	}
}

func sqrt(x float64) float64 {
	z := x
	for range 30 {
		z -= (z*z - x) / (2 * z)
	}
	return z
}

func TestKernelRoundRobinAndWeightedRoundRobin(t *testing.T) {
	topo, b := newCluster(t, Options{})
	even := service("even", plan.TCP, 80, 0, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	weighted := service("weighted", plan.TCP, 80, 0, []string{"10.96.0.11"}, podEP(podA, 300), podEP(podB, 100))
	weighted.Scheduler = plan.SchedulerWeightedRoundRobin
	mustSync(t, b, testPlan(even, weighted), backends.FullSync())

	const n = 90
	tally := netns.Tally(netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), n))
	for _, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		within4Sigma(t, "rr "+pod, tally[pod], n, 1.0/3)
	}
	if got := kernelServers(t, b)["TCP 10.96.0.11:80"]; got != "wrr 10.244.0.11:8080 w3 10.244.0.12:8080 w1" {
		t.Errorf("plan weights 300:100: kernel has %q, want weights 3:1", got)
	}
	const m = 200
	tally = netns.Tally(netns.DialMany(t, topo.Client, netip.MustParseAddrPort("10.96.0.11:80"), m))
	within4Sigma(t, "wrr 3:1 pod-a", tally["pod-a"], m, 0.75)
	if tally["pod-a"]+tally["pod-b"] != m {
		t.Errorf("wrr: answers %v, want only pod-a and pod-b", tally)
	}
}

func TestKernelSourceHashAndAffinityKeepAClient(t *testing.T) {
	topo, b := newCluster(t, Options{})
	hashed := service("hashed", plan.TCP, 80, 0, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	hashed.Scheduler = plan.SchedulerSourceHash
	sticky := service("sticky", plan.TCP, 80, 30081, []string{"10.96.0.11"}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	mustSync(t, b, testPlan(hashed, sticky), backends.FullSync())

	for _, addr := range []netip.AddrPort{netip.AddrPortFrom(vip, 80), netip.MustParseAddrPort("10.96.0.11:80")} {
		first := netns.DialMany(t, topo.Client, addr, 1)[0].Pod
		netns.WantPods(t, addr.String()+" from one client", netns.DialMany(t, topo.Client, addr, 20), first)
	}
	if got := kernelServers(t, b)["TCP 10.96.0.11:80"]; got != "rr persistent 600s 10.244.0.11:8080 w1 10.244.0.12:8080 w1 10.244.0.13:8080 w1" {
		t.Errorf("sticky service: kernel has %q, want persistence of 600s", got)
	}
}

func TestKernelGracefulTermination(t *testing.T) {
	topo, b := newCluster(t, Options{})
	const port = 9000
	holdServer(t, topo, port, "pod-a", "pod-b")
	eps := []plan.Endpoint{ep(podA.String(), port, 1), ep(podB.String(), port, 1)}
	hold := service("hold", plan.TCP, port, 0, []string{vip.String()}, eps...)
	p := testPlan(hold)
	mustSync(t, b, p, backends.FullSync())
	addr := netip.AddrPortFrom(vip, port)
	key := "TCP " + addr.String()

	conn := dialHold(t, topo.Client, addr)
	kept := conn.ask(t)
	gone, stays := eps[0], eps[1]
	if kept == "pod-b" {
		gone, stays = eps[1], eps[0]
	}
	setEndpoints := func(eps ...plan.Endpoint) {
		s := hold.Clone()
		s.Endpoints = eps
		p.Services[hold.Key] = s
		mustSync(t, b, p, backends.PartialSync(hold.Key))
	}
	setEndpoints(stays)
	drained := newVirtualServer("rr", 0)
	drained.reals[gone.AddrPort()], drained.reals[stays.AddrPort()] = 0, 1
	if got, want := kernelServers(t, b)[key], drained.String(); got != want {
		t.Errorf("after removing %s: kernel has %q, want %q", kept, got, want)
	}
	for range 6 {
		c := dialHold(t, topo.Client, addr)
		if got := c.ask(t); got == kept {
			t.Errorf("a new connection reached the removed %s", kept)
		}
		c.reset()
	}
	if got := conn.ask(t); got != kept {
		t.Errorf("the established connection now reaches %s, want still %s", got, kept)
	}

	// Back before its connections ended: restored at its weight.
	setEndpoints(eps...)
	seen := map[string]bool{}
	for range 4 {
		c := dialHold(t, topo.Client, addr)
		seen[c.ask(t)] = true
		c.reset()
	}
	if !seen[kept] {
		t.Errorf("restored %s got no new connection in 4 (round robin over 2)", kept)
	}

	setEndpoints(stays)
	if got := conn.ask(t); got != kept {
		t.Errorf("after the second removal the established connection reaches %s, want %s", got, kept)
	}
	conn.reset()
	start := time.Now()
	eventually(t, 30*time.Second, "the drained real server is deleted once its connection closed", func() bool {
		return kernelServers(t, b)[key] == fmt.Sprintf("rr %s w1", stays.AddrPort())
	})
	t.Logf("drained real server deleted %s after its connection was reset", time.Since(start).Round(100*time.Millisecond))
}

func TestKernelGracePeriodEndsDraining(t *testing.T) {
	topo, b := newCluster(t, Options{GracePeriod: 2 * time.Second})
	const port = 9000
	holdServer(t, topo, port, "pod-a")
	hold := service("hold", plan.TCP, port, 0, []string{vip.String()}, ep(podA.String(), port, 1))
	p := testPlan(hold)
	mustSync(t, b, p, backends.FullSync())
	addr := netip.AddrPortFrom(vip, port)
	conn := dialHold(t, topo.Client, addr)
	conn.ask(t)
	empty := hold.Clone()
	empty.Endpoints = nil
	p.Services[hold.Key] = empty
	mustSync(t, b, p, backends.PartialSync(hold.Key))
	eventually(t, 10*time.Second, "a real server with an open connection is deleted after the grace period", func() bool {
		return kernelServers(t, b)["TCP "+addr.String()] == "rr"
	})
}

func TestKernelFullSyncRemovesStraysAndRepairsDrift(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())

	strayOnLink := vsKey{addr: vip, proto: plan.TCP, port: 81}
	strayNodePort := vsKey{addr: topo.NodeIP, proto: plan.UDP, port: 30999}
	foreign := vsKey{addr: netip.MustParseAddr("10.200.0.1"), proto: plan.TCP, port: 80}
	addForeign(t, b, strayOnLink, netip.AddrPortFrom(podC, podPort))
	addForeign(t, b, strayNodePort, netip.AddrPortFrom(podC, podPort))
	addForeign(t, b, foreign, netip.AddrPortFrom(podC, podPort))
	webVS := vsKey{addr: vip, proto: plan.TCP, port: 80}
	b.mu.Lock()
	svc := toService(webVS, b.programmed[webVS])
	errs := []error{
		b.ipvs.DelDestination(svc, toDestination(netip.AddrPortFrom(podB, podPort), 1)),
		b.ipvs.UpdateDestination(svc, toDestination(netip.AddrPortFrom(podA, podPort), 7)),
		b.ipvs.UpdateService(toService(webVS, newVirtualServer("lc", 0))),
	}
	b.mu.Unlock()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	strayAddr := netip.MustParseAddr("10.96.9.9")
	b.mu.Lock()
	l, _ := b.nl.LinkByName(b.opts.Interface)
	err := addAddr(b.nl, l, strayAddr)
	b.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	mustSync(t, b, p, backends.FullSync())
	got := kernelServers(t, b)
	want := map[string]string{
		"TCP 10.96.0.10:80":    "rr 10.244.0.11:8080 w1 10.244.0.12:8080 w1",
		"TCP 172.30.0.1:30080": "rr 10.244.0.11:8080 w1 10.244.0.12:8080 w1",
		"TCP 10.200.0.1:80":    "rr 10.244.0.13:8080 w1",
	}
	if !maps.Equal(got, want) {
		t.Errorf("after a full sync: kernel has %v, want %v (strays on Weir's addresses gone, the foreign one kept, drift repaired)", got, want)
	}
	wantLinkAddrs(t, b, vip)
	netns.WantPods(t, "repaired service", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 20), "pod-a", "pod-b")
}

func TestKernelPartialSyncTouchesOnlyTheChangedService(t *testing.T) {
	topo, b := newCluster(t, Options{})
	one := service("one", plan.TCP, 80, 0, []string{vip.String()}, podEP(podA, 1))
	two := service("two", plan.TCP, 80, 0, []string{"10.96.0.11"}, podEP(podA, 1))
	p := testPlan(one, two)
	mustSync(t, b, p, backends.FullSync())
	// Drift on "two", behind the backend's back: a partial sync of "one"
	// must neither read nor repair it.
	addForeign(t, b, vsKey{addr: netip.MustParseAddr("10.96.0.11"), proto: plan.TCP, port: 81})
	before := kernelServers(t, b)

	changed := one.Clone()
	changed.Endpoints = []plan.Endpoint{podEP(podB, 1), podEP(podC, 2)}
	changed.Scheduler = plan.SchedulerWeightedRoundRobin
	third := service("three", plan.UDP, 53, 0, []string{"10.96.0.12"}, podEP(podC, 1))
	p.Services[one.Key] = changed
	p.Services[third.Key] = third
	mustSync(t, b, p, backends.PartialSync(one.Key, third.Key))

	after := kernelServers(t, b)
	want := maps.Clone(before)
	// pod-a, removed without a connection open, drains at weight 0 until
	// the graceful-termination loop (every second) deletes it: both are
	// right.
	want["TCP 10.96.0.10:80"] = "wrr 10.244.0.11:8080 w0 10.244.0.12:8080 w1 10.244.0.13:8080 w2"
	if reaped := "wrr 10.244.0.12:8080 w1 10.244.0.13:8080 w2"; after["TCP 10.96.0.10:80"] == reaped {
		want["TCP 10.96.0.10:80"] = reaped
	}
	want["UDP 10.96.0.12:53"] = "rr 10.244.0.13:8080 w1"
	if !maps.Equal(after, want) {
		t.Errorf("after a partial sync of one and three:\n got %v\nwant %v", after, want)
	}
	netns.WantPods(t, "changed service", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 12), "pod-b", "pod-c")
	netns.WantPods(t, "untouched service", netns.DialMany(t, topo.Client, netip.MustParseAddrPort("10.96.0.11:80"), 3), "pod-a")
	wantLinkAddrs(t, b, vip, netip.MustParseAddr("10.96.0.11"), netip.MustParseAddr("10.96.0.12"))

	delete(p.Services, third.Key)
	mustSync(t, b, p, backends.PartialSync(third.Key))
	if _, ok := kernelServers(t, b)["UDP 10.96.0.12:53"]; ok {
		t.Error("deleted service's virtual server is still there")
	}
	wantLinkAddrs(t, b, vip, netip.MustParseAddr("10.96.0.11"))
}

func TestKernelSCTPIsAccepted(t *testing.T) {
	_, b := newCluster(t, Options{})
	sig := service("sig", plan.SCTP, 3868, 30868, []string{vip.String()}, podEP(podA, 1))
	mustSync(t, b, testPlan(sig), backends.FullSync())
	got := kernelServers(t, b)
	if got["SCTP 10.96.0.10:3868"] != "rr 10.244.0.11:8080 w1" || got["SCTP 172.30.0.1:30868"] == "" {
		t.Errorf("SCTP service: kernel has %v", got)
	}
}

func TestKernelCleanupRemovesEverything(t *testing.T) {
	topo, b := newCluster(t, Options{StrictARP: true})
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1))
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	mustSync(t, b, testPlan(web), backends.FullSync())
	foreign := vsKey{addr: netip.MustParseAddr("10.200.0.1"), proto: plan.TCP, port: 80}
	addForeign(t, b, foreign)

	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := kernelServers(t, b); len(got) != 1 || got[foreign.String()] == "" {
		t.Errorf("after Cleanup: kernel has %v, want only the foreign %s", got, foreign)
	}
	b.mu.Lock()
	_, err := b.nl.LinkByName(b.opts.Interface)
	b.mu.Unlock()
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Errorf("after Cleanup: interface %s: %v, want it gone", b.opts.Interface, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if a, err := topo.Client.DialTCP(ctx, netip.AddrPortFrom(topo.NodeIP, 30080)); err == nil {
		t.Errorf("after Cleanup the node port still answered from %s", a.Pod)
	}
}

func TestKernelDualStack(t *testing.T) {
	topo := netns.NewThreePods(t, netns.DualStack("pod-a", "pod-b"))
	b, err := New(Options{Common: backendsCommon(topo.Node.Fd())})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	vip6 := netip.MustParseAddr("fd00:10:96::10")
	web := service("web", plan.TCP, 80, 30080, []string{vip.String(), vip6.String()},
		podEP(podA, 1), podEP(podB, 1), ep(netns.PodA6.String(), podPort, 1), ep(netns.PodB6.String(), podPort, 1))
	mustSync(t, b, testPlan(web), backends.FullSync())

	answers := netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip6, 80), 20)
	netns.WantPods(t, "IPv6 cluster IP", answers, "pod-a", "pod-b")
	if src := answers[0].Source.Addr(); src != topo.ClientIP6 {
		t.Errorf("IPv6 cluster IP: pod saw %s, want the client's %s", src, topo.ClientIP6)
	}
	netns.WantPods(t, "IPv6 node port", netns.DialMany(t, topo.Client, netip.AddrPortFrom(topo.NodeIP6, 30080), 20), "pod-a", "pod-b")
	netns.WantPods(t, "IPv4 cluster IP beside it", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 20), "pod-a", "pod-b")
	wantLinkAddrs(t, b, vip, vip6)
}
