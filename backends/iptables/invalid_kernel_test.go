package iptables

import (
	"context"
	"encoding/binary"
	"net/netip"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelDropsInvalid sends, from the client through the node to a
// pod, a TCP segment conntrack calls invalid (SYN and FIN at once): like
// kube-proxy, KUBE-FORWARD drops it, as its counter shows, unless
// KeepInvalid (conntrack.tcpBeLiberal) leaves such packets alone.
func TestKernelDropsInvalid(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		for _, keep := range []bool{false, true} {
			topo := ktTopology(t)
			b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd()}, Flavour: fl, KeepInvalid: keep})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			ktSync(t, b, ktPlan(ktService("web", ktVIP, ktPodA)), backends.FullSync())
			for range 3 {
				sendSynFin(t, topo.Client, topo.ClientIP, netip.AddrPortFrom(ktPodA, ktPort))
			}
			dropped, present := invalidDrops(t, topo, b.fl)
			switch {
			case keep && present:
				t.Errorf("KeepInvalid: KUBE-FORWARD still drops invalid packets")
			case !keep && (!present || dropped < 3):
				t.Errorf("the invalid-packet drop rule (present: %v) counted %d packets, want 3", present, dropped)
			}
		}
	})
}

// invalidDrops returns the packet counter of KUBE-FORWARD's rule dropping
// invalid packets, and whether the rule is there.
func invalidDrops(t *testing.T, topo *netns.Topology, fl *flavour) (uint64, bool) {
	t.Helper()
	out, _, err := runTool(context.Background(), topo.Node.Fd(), nil, fl.tools(ipv4).save, "-c", "-t", tableFilter)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\[(\d+):\d+\] -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP$`).FindSubmatch(out)
	if m == nil {
		return 0, false
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return n, true
}

// sendSynFin sends one TCP segment with both SYN and FIN set from src (an
// address of ns) to dst, over a raw socket in ns.
func sendSynFin(t *testing.T, ns *netns.Namespace, src netip.Addr, dst netip.AddrPort) {
	t.Helper()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], 40000)
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], 1)
	seg[12] = 5 << 4      // data offset: 5 words
	seg[13] = 0x02 | 0x01 // SYN, FIN
	binary.BigEndian.PutUint16(seg[14:], 65535)
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src, dst.Addr(), seg))
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
	})
	if err != nil {
		t.Fatalf("send a SYN+FIN segment: %v", err)
	}
}

// tcpChecksum is the TCP checksum of seg over the IPv4 pseudo-header.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(s[:])
	add(d[:])
	sum += uint32(unix.IPPROTO_TCP) + uint32(len(seg))
	add(seg)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
