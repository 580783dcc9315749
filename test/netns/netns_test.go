package netns

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

var (
	ipA = netip.MustParseAddr("10.244.0.11")
	ipB = netip.MustParseAddr("10.244.0.12")
	ipC = netip.MustParseAddr("10.244.0.13")
)

// twoPods is the usual test cluster: pod-a serving 80 and 8080, pod-b 80.
func twoPods() Options {
	return Options{Pods: []PodSpec{
		{Name: "a", IP: ipA, Ports: []uint16{80, 8080}},
		{Name: "b", IP: ipB, Ports: []uint16{80}},
	}}
}

// probeCtx bounds one probe.
func probeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dial probes addr from ns over TCP and fails the test on error.
func dial(t *testing.T, ns *Namespace, addr netip.AddrPort) Answer {
	t.Helper()
	a, err := ns.DialTCP(probeCtx(t), addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return a
}

func TestTopology(t *testing.T) {
	topo := NewT(t, twoPods())
	a, b := topo.Pods["a"], topo.Pods["b"]
	at := func(ip netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ip, port) }

	t.Run("names", func(t *testing.T) {
		for _, ns := range []*Namespace{topo.Node, topo.Client, a.NS, b.NS} {
			if !strings.HasPrefix(ns.Name, "weir-"+topo.ID+"-") {
				t.Errorf("namespace %s lacks the run prefix", ns.Name)
			}
			if _, err := os.Stat(filepath.Join(runDir, ns.Name)); err != nil {
				t.Errorf("namespace %s: %v", ns.Name, err)
			}
		}
		for _, l := range []string{topo.ClientLink, a.Link, b.Link} {
			if len(l) > 15 {
				t.Errorf("interface name %q exceeds IFNAMSIZ", l)
			}
		}
	})
	t.Run("client reaches pods directly", func(t *testing.T) {
		for _, p := range []*Pod{a, b} {
			got := dial(t, topo.Client, at(p.IP, 80))
			if got.Pod != p.Name || got.Source.Addr() != topo.ClientIP {
				t.Errorf("tcp to %s: got %v, want pod %s seeing %s", p.IP, got, p.Name, topo.ClientIP)
			}
			got, err := topo.Client.AskUDP(probeCtx(t), at(p.IP, 80))
			if err != nil || got.Pod != p.Name || got.Source.Addr() != topo.ClientIP {
				t.Errorf("udp to %s: got %v, %v", p.IP, got, err)
			}
		}
		if got := dial(t, topo.Client, at(ipA, 8080)); got.Pod != "a" {
			t.Errorf("second port: got %v", got)
		}
	})
	t.Run("node reaches pod from node IP", func(t *testing.T) {
		if got := dial(t, topo.Node, at(ipB, 80)); got.Pod != "b" || got.Source.Addr() != topo.NodeIP {
			t.Errorf("got %v, want pod b seeing %s", got, topo.NodeIP)
		}
	})
	t.Run("pod reaches pod", func(t *testing.T) {
		if got := dial(t, a.NS, at(ipB, 80)); got.Pod != "b" || got.Source.Addr() != ipA {
			t.Errorf("got %v, want pod b seeing %s", got, ipA)
		}
	})
	t.Run("no listener is refused at once", func(t *testing.T) {
		start := time.Now()
		_, err := topo.Client.DialTCP(probeCtx(t), at(ipA, 81))
		if !errors.Is(err, ErrRefused) || time.Since(start) > 500*time.Millisecond {
			t.Errorf("tcp: got %v after %v, want ErrRefused at once", err, time.Since(start))
		}
		start = time.Now()
		_, err = topo.Client.AskUDP(probeCtx(t), at(ipA, 81))
		if !errors.Is(err, ErrRefused) || time.Since(start) > 500*time.Millisecond {
			t.Errorf("udp: got %v after %v, want ErrRefused at once", err, time.Since(start))
		}
	})
	t.Run("unprogrammed VIP times out", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		vip := at(topo.ServiceCIDR.Addr().Next(), 80)
		for _, ns := range []*Namespace{topo.Client, topo.Node, a.NS} {
			if _, err := ns.DialTCP(ctx, vip); !errors.Is(err, ErrTimeout) {
				t.Errorf("from %s: got %v, want ErrTimeout", ns.Name, err)
			}
		}
	})
	t.Run("udp keeps its local port", func(t *testing.T) {
		local := at(topo.ClientIP, 40000)
		c, err := topo.Client.DialUDP(local, at(ipB, 80))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 3 {
			got, err := c.Ask(probeCtx(t))
			if err != nil || got != (Answer{Pod: "b", Source: local}) {
				t.Fatalf("got %v, %v; want b seeing %s", got, err, local)
			}
		}
	})
	t.Run("sysctl and command", func(t *testing.T) {
		if err := topo.Node.Sysctl("net.ipv4.conf.all.rp_filter", "0"); err != nil {
			t.Fatal(err)
		}
		var fwd []byte
		err := topo.Node.Do(func() (err error) {
			fwd, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			return err
		})
		if err != nil || strings.TrimSpace(string(fwd)) != "1" {
			t.Errorf("node ip_forward = %q, %v", fwd, err)
		}
		out, err := topo.Client.Command(probeCtx(t), "ip", "-4", "-o", "addr", "show", "dev", "eth0").Output()
		if err != nil || !strings.Contains(string(out), topo.ClientIP.String()+"/24") {
			t.Errorf("client addresses: %s, %v", out, err)
		}
	})
	t.Run("add pod later", func(t *testing.T) {
		c, err := topo.AddPod(PodSpec{Name: "c", IP: ipC, Ports: []uint16{80}})
		if err != nil {
			t.Fatal(err)
		}
		if got := dial(t, topo.Client, at(c.IP, 80)); got.Pod != "c" {
			t.Errorf("got %v", got)
		}
		if err := c.Listen(9090); err != nil {
			t.Fatal(err)
		}
		if got := dial(t, b.NS, at(c.IP, 9090)); got.Pod != "c" || got.Source.Addr() != ipB {
			t.Errorf("got %v", got)
		}
		if _, err := topo.AddPod(PodSpec{Name: "d", IP: ipC}); err == nil {
			t.Error("AddPod accepted a duplicate IP")
		}
	})
}

// leftovers lists what a run with the given ID left behind: named
// namespaces, interfaces in this namespace, and this process's threads or
// descriptors still inside another network namespace.
func leftovers(t *testing.T, id string) []string {
	t.Helper()
	var left []string
	entries, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "weir-"+id+"-") {
			left = append(left, "namespace "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "w"+id) {
			left = append(left, "root interface "+l.Attrs().Name)
		}
	}
	return append(left, foreignNetns(t)...)
}

// foreignNetns lists this process's threads and descriptors that refer to
// a network namespace other than the main thread's.
func foreignNetns(t *testing.T) []string {
	t.Helper()
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	threads, _ := filepath.Glob("/proc/self/task/*/ns/net")
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, p := range append(threads, fds...) {
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, "net:") && target != home {
			refs = append(refs, p+" -> "+target)
		}
	}
	return refs
}

func TestCloseRemovesEverything(t *testing.T) {
	RequireRoot(t)
	for name, opts := range map[string]func() Options{"ipv4": twoPods, "dual-stack": dualPods} {
		t.Run(name, func(t *testing.T) { testClose(t, opts()) })
	}
}

// testClose checks that Close removes everything a topology built from opts
// created, and that a closed topology takes no more pods.
func testClose(t *testing.T, opts Options) {
	topo, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, topo.ID); len(left) < 4 {
		t.Fatalf("expected the run's namespaces and handles, found %v", left)
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if left := leftovers(t, topo.ID); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil || strings.Contains(string(out), topo.ID) {
		t.Errorf("ip netns list still shows the run: %s, %v", out, err)
	}
	if _, err := topo.AddPod(PodSpec{Name: "late", IP: ipC}); err == nil {
		t.Error("AddPod succeeded after Close")
	}
}

func TestSetupFailureCleansUp(t *testing.T) {
	RequireRoot(t)
	for name, opts := range map[string]func() Options{"ipv4": twoPods, "dual-stack": dualPods} {
		t.Run(name, func(t *testing.T) { testSetupFailure(t, opts) })
	}
}

// testSetupFailure fails New at each of its steps in turn and checks that
// nothing is left behind.
func testSetupFailure(t *testing.T, newOpts func() Options) {
	var steps []string
	ok := newOpts()
	ok.hook = func(_ *Topology, step string) error {
		steps = append(steps, step)
		return nil
	}
	topo, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected failure")
	for _, step := range steps {
		t.Run("fail at "+step, func(t *testing.T) {
			opts := newOpts()
			var id string
			opts.hook = func(topo *Topology, s string) error {
				id = topo.ID
				if s == step {
					return injected
				}
				return nil
			}
			if _, err := New(opts); !errors.Is(err, injected) {
				t.Fatalf("New: got %v, want the injected failure", err)
			}
			if left := leftovers(t, id); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func TestInvalidPodsCleanUp(t *testing.T) {
	RequireRoot(t)
	cases := map[string]PodSpec{
		"duplicate IP":    {Name: "c", IP: ipA},
		"duplicate name":  {Name: "a", IP: ipC},
		"invalid name":    {Name: "Pod_C", IP: ipC},
		"IP outside CIDR": {Name: "c", IP: netip.MustParseAddr("10.96.0.5")},
		"no IP":           {Name: "c"},
		"port taken":      {Name: "c", IP: ipC, Ports: []uint16{80, 80}},
		"duplicate IP6":   {Name: "c", IP: ipC, IP6: ip6A},
		"IP6 outside CIDR6": {Name: "c", IP: ipC,
			IP6: netip.MustParseAddr("fd00:10:96::5")},
		"IPv4 as IP6":      {Name: "c", IP: ipC, IP6: netip.MustParseAddr("10.244.0.13")},
		"mapped IP6":       {Name: "c", IP: ipC, IP6: netip.MustParseAddr("::ffff:10.244.0.13")},
		"IP6 is CIDR base": {Name: "c", IP: ipC, IP6: netip.MustParseAddr("fd00:10:244::")},
		"zoned IP6":        {Name: "c", IP: ipC, IP6: netip.MustParseAddr("fd00:10:244::13%eth0")},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			opts := twoPods()
			if bad.IP6.IsValid() {
				opts = dualPods()
			}
			opts.Pods = append(opts.Pods, bad)
			var id string
			opts.hook = func(topo *Topology, _ string) error {
				id = topo.ID
				return nil
			}
			if _, err := New(opts); err == nil {
				t.Fatal("New accepted the pod")
			} else {
				t.Log(err)
			}
			if left := leftovers(t, id); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func TestInvalidOptions(t *testing.T) {
	cases := map[string]Options{
		"overlap":        {PodCIDR: netip.MustParsePrefix("10.0.0.0/8")},
		"unmasked":       {ServiceCIDR: netip.MustParsePrefix("10.96.0.1/12")},
		"ipv6":           {PodCIDR: netip.MustParsePrefix("fd00::/64")},
		"tiny client":    {ClientSubnet: netip.MustParsePrefix("172.30.0.0/31")},
		"gateway inside": {PodCIDR: netip.MustParsePrefix("169.254.0.0/16")},
		"ipv4 pod CIDR6": {PodCIDR6: netip.MustParsePrefix("10.245.0.0/16")},
		"mapped CIDR6":   {ServiceCIDR6: netip.MustParsePrefix("::ffff:10.97.0.0/112")},
		"unmasked6":      {ServiceCIDR6: netip.MustParsePrefix("fd00:10:96::1/112")},
		"overlap6":       {ClientSubnet6: netip.MustParsePrefix("fd00:10::/32")},
		"tiny client6":   {ClientSubnet6: netip.MustParsePrefix("fd00:172:30::/127")},
		"link-local6":    {PodCIDR6: netip.MustParsePrefix("fe80::/64")},
	}
	for name, opts := range cases {
		if err := opts.normalize(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseAndTally(t *testing.T) {
	a, err := parseAnswer([]byte("pod-a 172.30.0.2:40000\n"))
	want := Answer{Pod: "pod-a", Source: netip.MustParseAddrPort("172.30.0.2:40000")}
	if err != nil || a != want {
		t.Fatalf("parse: got %v, %v", a, err)
	}
	a, err = parseAnswer([]byte("pod-a [fd00:172:30::2]:40000\n"))
	want6 := Answer{Pod: "pod-a", Source: netip.MustParseAddrPort("[fd00:172:30::2]:40000")}
	if err != nil || a != want6 || a.String() != "pod-a [fd00:172:30::2]:40000" {
		t.Fatalf("parse IPv6: got %v, %v", a, err)
	}
	if _, err := parseAnswer([]byte("garbage")); err == nil {
		t.Error("parsed garbage")
	}
	got := Tally([]Answer{want, want, {Pod: "b"}})
	if got["pod-a"] != 2 || got["b"] != 1 || len(got) != 2 {
		t.Errorf("tally: %v", got)
	}
}
