package conntrack

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// trackAll turns connection tracking on for both address families in ns:
// an inet output chain whose one rule loads the ct state.
func trackAll(t *testing.T, ns *netns.Namespace) { trackAllTB(t, ns) }

func trackAllTB(t testing.TB, ns *netns.Namespace) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "weirct"})
	ch := c.AddChain(&nftables.Chain{Name: "output", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE}}})
	if err := c.Flush(); err != nil {
		t.Fatalf("nftables: %v", err)
	}
	t.Cleanup(func() {
		c.DelTable(tbl)
		if err := c.Flush(); err != nil {
			t.Errorf("nftables cleanup: %v", err)
		}
	})
}

// discardPort is the loopback port localTraffic sends to.
const discardPort = 9

var (
	lo4 = netip.MustParseAddr("127.0.0.1")
	lo6 = netip.IPv6Loopback()
)

// The entries localTraffic leaves, as prefixes of entry.String.
const (
	udp4  = "udp 127.0.0.1:40004 -> 127.0.0.1:9"
	udp6  = "udp [::1]:40006 -> [::1]:9"
	sctp4 = "sctp 127.0.0.1:40132 -> 127.0.0.1:9"
	tcp4  = "tcp 127.0.0.1:"
)

var allLo = []string{udp4, udp6, sctp4, tcp4}

// localTraffic sends one UDP datagram over each family and an SCTP INIT
// (this kernel has no SCTP sockets; a raw packet is enough for conntrack) to
// loopback port 9 in ns, where nothing answers them, and makes one TCP
// connection to a listener there.
func localTraffic(t *testing.T, ns *netns.Namespace) {
	t.Helper()
	err := ns.Do(func() error {
		for _, local := range []netip.AddrPort{netip.AddrPortFrom(lo4, 40004), netip.AddrPortFrom(lo6, 40006)} {
			remote := netip.AddrPortFrom(local.Addr(), discardPort)
			c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(local), net.UDPAddrFromAddrPort(remote))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("?"))
			c.Close()
			if err != nil {
				return err
			}
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Sendto(fd, sctpInit(40132, discardPort), 0, &unix.SockaddrInet4{Addr: lo4.As4()}); err != nil {
			return err
		}
		l, err := net.Listen("tcp", netip.AddrPortFrom(lo4, discardPort).String())
		if err != nil {
			return err
		}
		defer l.Close()
		c, err := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		t.Fatalf("traffic in %s: %v", ns.Name, err)
	}
}

// sctpInit is an SCTP packet holding one INIT chunk.
func sctpInit(sport, dport uint16) []byte {
	b := make([]byte, 12+20)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	c := b[12:]
	c[0] = 1 // INIT
	binary.BigEndian.PutUint16(c[2:], 20)
	binary.BigEndian.PutUint32(c[4:], 0x5eed) // initiate tag
	binary.BigEndian.PutUint32(c[8:], 1<<16)  // receiver window
	binary.BigEndian.PutUint16(c[12:], 1)     // outbound streams
	binary.BigEndian.PutUint16(c[14:], 1)     // inbound streams
	binary.BigEndian.PutUint32(c[16:], 1)     // initial TSN
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// wantEntries fails the test unless ns has an entry starting with each of
// want and none starting with any of unwanted.
func wantEntries(t *testing.T, ns *netns.Namespace, want, unwanted []string) {
	t.Helper()
	got := entries(t, ns)
	has := func(prefix string) bool {
		for _, e := range got {
			if strings.HasPrefix(e, prefix) {
				return true
			}
		}
		return false
	}
	for _, w := range want {
		if !has(w) {
			t.Errorf("%s: no entry %q in %q", ns.Name, w, got)
		}
	}
	for _, u := range unwanted {
		if has(u) {
			t.Errorf("%s: entry %q still in %q", ns.Name, u, got)
		}
	}
}

// TestClearFamiliesProtocolsNamespaces checks IPv6 and SCTP entries, zero
// destination addresses, that TCP is refused, and that a Cleaner touches
// only its own namespace, including one made with netnsFd 0.
func TestClearFamiliesProtocolsNamespaces(t *testing.T) {
	topo := netns.NewT(t, netns.Options{Pods: []netns.PodSpec{{Name: "a", IP: podA}}})
	pod := topo.Pods["a"].NS
	for _, ns := range []*netns.Namespace{topo.Node, pod} {
		trackAll(t, ns)
		localTraffic(t, ns)
		wantEntries(t, ns, allLo, nil)
	}

	n, err := newCleaner(t, topo.Node).Clear(testCtx(t), []Flow{
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(lo6, discardPort)},
		{Protocol: plan.SCTP, Dest: netip.AddrPortFrom(lo4, discardPort)},
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, discardPort), Endpoint: netip.MustParseAddr("127.0.0.2")},
		{Protocol: plan.TCP, Dest: netip.AddrPortFrom(lo4, discardPort)},
	})
	if n != 2 || err == nil || !strings.Contains(err.Error(), "flow TCP 127.0.0.1:9:") {
		t.Fatalf("Clear = %d, %v; want 2 and an error naming the TCP flow", n, err)
	}
	wantEntries(t, topo.Node, []string{udp4, tcp4}, []string{udp6, sctp4})
	wantEntries(t, pod, allLo, nil)

	// netnsFd 0: the namespace of the thread that calls Clear.
	err = pod.Do(func() error {
		c, err := New(0, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err = c.Clear(ctx, []Flow{{Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, discardPort)}})
		return err
	})
	if err != nil || n != 2 {
		t.Fatalf("Clear(UDP *:9) in the pod = %d, %v; want 2 (both families)", n, err)
	}
	wantEntries(t, pod, []string{sctp4, tcp4}, []string{udp4, udp6})
	wantEntries(t, topo.Node, []string{udp4, tcp4}, nil)
}

// BenchmarkClearLargeTable measures one Clear, which deletes nothing, over a
// table of 20,000 UDP entries: the cost of the single dump and its filtering.
func BenchmarkClearLargeTable(b *testing.B) {
	const size = 20000
	topo := netns.NewT(b, netns.Options{})
	trackAllTB(b, topo.Node)
	err := topo.Node.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for port := range size {
			if err := unix.Sendto(fd, []byte("?"), 0, &unix.SockaddrInet4{Port: 10000 + port, Addr: lo4.As4()}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(topo.Node.Fd(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	flows := []Flow{{Protocol: plan.UDP, Dest: netip.MustParseAddrPort("10.96.0.10:53"), Endpoint: podA}}
	b.ResetTimer()
	for range b.N {
		if n, err := c.Clear(context.Background(), flows); n != 0 || err != nil {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/size, "ns/entry")
}
