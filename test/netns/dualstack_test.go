package netns

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

var (
	ip6A = netip.MustParseAddr("fd00:10:244::11")
	ip6B = netip.MustParseAddr("fd00:10:244::12")
	ip6C = netip.MustParseAddr("fd00:10:244::13")
	ipV4 = netip.MustParseAddr("10.244.0.14")
)

// dualPods is twoPods made dual-stack, plus pod v4only, which has no IPv6
// address and serves 80.
func dualPods() Options {
	return Options{Pods: []PodSpec{
		{Name: "a", IP: ipA, IP6: ip6A, Ports: []uint16{80, 8080}},
		{Name: "b", IP: ipB, IP6: ip6B, Ports: []uint16{80}},
		{Name: "v4only", IP: ipV4, Ports: []uint16{80}},
	}}
}

// readSysctl reads key in ns.
func readSysctl(t *testing.T, ns *Namespace, key string) string {
	t.Helper()
	var b []byte
	err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
		return err
	})
	if err != nil {
		t.Fatalf("%s in %s: %v", key, ns.Name, err)
	}
	return strings.TrimSpace(string(b))
}

// ipOutput runs ip with args in ns and returns its output.
func ipOutput(t *testing.T, ns *Namespace, args ...string) string {
	t.Helper()
	out, err := ns.Command(probeCtx(t), "ip", args...).Output()
	if err != nil {
		t.Fatalf("ip %v in %s: %v", args, ns.Name, err)
	}
	return string(out)
}

func TestDualStack(t *testing.T) {
	topo := NewT(t, dualPods())
	a, b, v4 := topo.Pods["a"], topo.Pods["b"], topo.Pods["v4only"]
	at := netip.AddrPortFrom

	t.Run("addresses", func(t *testing.T) {
		if topo.NodeIP6 != netip.MustParseAddr("fd00:172:30::1") ||
			topo.ClientIP6 != netip.MustParseAddr("fd00:172:30::2") ||
			topo.PodCIDR6 != DefaultPodCIDR6 || topo.ServiceCIDR6 != DefaultServiceCIDR6 {
			t.Errorf("IPv6 plan: node %s client %s pods %s services %s",
				topo.NodeIP6, topo.ClientIP6, topo.PodCIDR6, topo.ServiceCIDR6)
		}
		if a.IP6 != ip6A || v4.IP6.IsValid() {
			t.Errorf("pod IP6: a %v, v4only %v", a.IP6, v4.IP6)
		}
		for ns, want := range map[*Namespace]string{
			topo.Client: topo.ClientIP6.String() + "/64",
			a.NS:        ip6A.String() + "/128",
			b.NS:        ip6B.String() + "/128",
		} {
			out := ipOutput(t, ns, "-6", "-o", "addr", "show", "dev", "eth0")
			if !strings.Contains(out, want) {
				t.Errorf("%s eth0 lacks %s:\n%s", ns.Name, want, out)
			}
		}
		for _, ns := range []*Namespace{topo.Node, topo.Client, a.NS, b.NS, v4.NS} {
			if out := ipOutput(t, ns, "-6", "-o", "addr", "show", "tentative"); out != "" {
				t.Errorf("%s has tentative addresses:\n%s", ns.Name, out)
			}
		}
		if out := ipOutput(t, v4.NS, "-6", "-o", "addr", "show", "scope", "global"); out != "" {
			t.Errorf("IPv4-only pod has global IPv6 addresses:\n%s", out)
		}
		if out := ipOutput(t, v4.NS, "-6", "route", "show", "default"); out != "" {
			t.Errorf("IPv4-only pod has an IPv6 default route: %s", out)
		}
		if out := ipOutput(t, topo.Node, "-6", "route", "show", "default"); !strings.Contains(out, "via "+topo.ClientIP6.String()) {
			t.Errorf("node IPv6 default route: %s", out)
		}
		if out := ipOutput(t, a.NS, "-6", "route", "show", "default"); !strings.Contains(out, "via "+PodGateway6.String()) {
			t.Errorf("pod IPv6 default route: %s", out)
		}
	})
	t.Run("sysctls", func(t *testing.T) {
		for key, want := range map[string]string{
			"net.ipv6.conf.all.forwarding":       "1",
			"net.ipv6.conf.all.accept_redirects": "0",
			"net.ipv6.conf.all.accept_dad":       "0",
			"net.ipv6.icmp.ratelimit":            "0",
			"net.ipv6.icmp.ratemask":             "",
		} {
			if got := readSysctl(t, topo.Node, key); got != want {
				t.Errorf("node %s = %q, want %q", key, got, want)
			}
		}
		if got := readSysctl(t, topo.Client, "net.ipv6.conf.all.forwarding"); got != "0" {
			t.Errorf("client forwards IPv6 (%s)", got)
		}
		if got := readSysctl(t, a.NS, "net.ipv6.conf.eth0.accept_dad"); got != "0" {
			t.Errorf("pod eth0 accept_dad = %s", got)
		}
	})
	t.Run("client reaches pods directly over IPv6", func(t *testing.T) {
		for _, p := range []*Pod{a, b} {
			got := dial(t, topo.Client, at(p.IP6, 80))
			if got.Pod != p.Name || got.Source.Addr() != topo.ClientIP6 {
				t.Errorf("tcp to %s: got %v, want pod %s seeing %s", p.IP6, got, p.Name, topo.ClientIP6)
			}
			got, err := topo.Client.AskUDP(probeCtx(t), at(p.IP6, 80))
			if err != nil || got.Pod != p.Name || got.Source.Addr() != topo.ClientIP6 {
				t.Errorf("udp to %s: got %v, %v", p.IP6, got, err)
			}
		}
		if got := dial(t, topo.Client, at(ip6A, 8080)); got.Pod != "a" {
			t.Errorf("second port: got %v", got)
		}
	})
	t.Run("IPv4 still works", func(t *testing.T) {
		for _, p := range []*Pod{a, b, v4} {
			if got := dial(t, topo.Client, at(p.IP, 80)); got.Pod != p.Name || got.Source.Addr() != topo.ClientIP {
				t.Errorf("tcp to %s: got %v", p.IP, got)
			}
		}
	})
	t.Run("node reaches pod from node IP6", func(t *testing.T) {
		if got := dial(t, topo.Node, at(ip6B, 80)); got.Pod != "b" || got.Source.Addr() != topo.NodeIP6 {
			t.Errorf("tcp: got %v, want pod b seeing %s", got, topo.NodeIP6)
		}
		got, err := topo.Node.AskUDP(probeCtx(t), at(ip6B, 80))
		if err != nil || got.Pod != "b" || got.Source.Addr() != topo.NodeIP6 {
			t.Errorf("udp: got %v, %v", got, err)
		}
	})
	t.Run("pod reaches pod over IPv6", func(t *testing.T) {
		if got := dial(t, a.NS, at(ip6B, 80)); got.Pod != "b" || got.Source.Addr() != ip6A {
			t.Errorf("tcp: got %v, want pod b seeing %s", got, ip6A)
		}
		got, err := b.NS.AskUDP(probeCtx(t), at(ip6A, 8080))
		if err != nil || got.Pod != "a" || got.Source.Addr() != ip6B {
			t.Errorf("udp: got %v, %v", got, err)
		}
	})
	t.Run("no listener is refused at once over IPv6", func(t *testing.T) {
		start := time.Now()
		_, err := topo.Client.DialTCP(probeCtx(t), at(ip6A, 81))
		if !errors.Is(err, ErrRefused) || time.Since(start) > 500*time.Millisecond {
			t.Errorf("tcp: got %v after %v, want ErrRefused at once", err, time.Since(start))
		}
		start = time.Now()
		_, err = topo.Client.AskUDP(probeCtx(t), at(ip6A, 81))
		if !errors.Is(err, ErrRefused) || time.Since(start) > 500*time.Millisecond {
			t.Errorf("udp: got %v after %v, want ErrRefused at once", err, time.Since(start))
		}
	})
	t.Run("ICMPv6 errors are not rate-limited", func(t *testing.T) {
		// More than the global ICMP budget's burst of 50, back to back:
		// every one must come back refused, from the same socket.
		c, err := topo.Client.DialUDP(netip.AddrPort{}, at(ip6A, 81))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range 200 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := c.Ask(ctx)
			cancel()
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("probe %d: got %v, want ErrRefused", i, err)
			}
		}
	})
	t.Run("unprogrammed IPv6 VIP times out", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		vip := at(topo.ServiceCIDR6.Addr().Next(), 80)
		for _, ns := range []*Namespace{topo.Client, topo.Node, a.NS} {
			if _, err := ns.DialTCP(ctx, vip); !errors.Is(err, ErrTimeout) {
				t.Errorf("tcp from %s: got %v, want ErrTimeout", ns.Name, err)
			}
		}
		ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := topo.Client.AskUDP(ctx, vip); !errors.Is(err, ErrTimeout) {
			t.Errorf("udp from client: got %v, want ErrTimeout", err)
		}
	})
	t.Run("IPv4-only pod has no IPv6", func(t *testing.T) {
		// The node routes only the dual-stack pods' /128s, so a probe to
		// any other pod IP6 follows its default route back to the client
		// and dies there, like one to an unprogrammed VIP.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := topo.Client.DialTCP(ctx, at(ip6C, 80)); !errors.Is(err, ErrTimeout) {
			t.Errorf("unassigned pod IP6: got %v, want ErrTimeout", err)
		}
		if _, err := v4.NS.DialTCP(probeCtx(t), at(ip6A, 80)); !errors.Is(err, ErrUnreachable) {
			t.Errorf("from the IPv4-only pod: got %v, want ErrUnreachable (no IPv6 route)", err)
		}
	})
	t.Run("udp keeps its local port over IPv6", func(t *testing.T) {
		local := at(topo.ClientIP6, 40000)
		c, err := topo.Client.DialUDP(local, at(ip6B, 80))
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
	t.Run("add dual-stack pod later", func(t *testing.T) {
		c, err := topo.AddPod(PodSpec{Name: "c", IP: ipC, IP6: ip6C, Ports: []uint16{80}})
		if err != nil {
			t.Fatal(err)
		}
		if got := dial(t, topo.Client, at(c.IP6, 80)); got.Pod != "c" || got.Source.Addr() != topo.ClientIP6 {
			t.Errorf("got %v", got)
		}
		if err := c.Listen(9090); err != nil {
			t.Fatal(err)
		}
		if got := dial(t, b.NS, at(c.IP6, 9090)); got.Pod != "c" || got.Source.Addr() != ip6B {
			t.Errorf("got %v", got)
		}
		if _, err := topo.AddPod(PodSpec{Name: "d", IP: netip.MustParseAddr("10.244.0.15"), IP6: ip6C}); err == nil {
			t.Error("AddPod accepted a duplicate IP6")
		}
	})
	t.Run("zoned address is refused", func(t *testing.T) {
		if _, err := topo.Client.DialTCP(probeCtx(t), netip.MustParseAddrPort("[fe80::1%eth0]:80")); err == nil {
			t.Error("DialTCP accepted a zoned address")
		}
		if _, err := topo.Client.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("[fe80::1%eth0]:80")); err == nil {
			t.Error("DialUDP accepted a zoned address")
		}
	})
}

// TestCustomPlan6 builds a topology on a non-default IPv6 plan.
func TestCustomPlan6(t *testing.T) {
	topo := NewT(t, Options{
		PodCIDR6:      netip.MustParsePrefix("2001:db8:1::/48"),
		ServiceCIDR6:  netip.MustParsePrefix("2001:db8:2::/108"),
		ClientSubnet6: netip.MustParsePrefix("2001:db8:3::/126"),
		Pods:          []PodSpec{{Name: "x", IP: ipA, IP6: netip.MustParseAddr("2001:db8:1::5"), Ports: []uint16{80}}},
	})
	if topo.NodeIP6 != netip.MustParseAddr("2001:db8:3::1") || topo.ClientIP6 != netip.MustParseAddr("2001:db8:3::2") {
		t.Fatalf("node %s, client %s", topo.NodeIP6, topo.ClientIP6)
	}
	if got := dial(t, topo.Client, netip.MustParseAddrPort("[2001:db8:1::5]:80")); got.Pod != "x" || got.Source.Addr() != topo.ClientIP6 {
		t.Errorf("got %v", got)
	}
}
