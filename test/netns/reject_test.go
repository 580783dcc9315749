package netns

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// addReject makes ns reject, with an ICMP port-unreachable, everything
// it forwards or sends to addr.
func addReject(t *testing.T, ns *Namespace, addr netip.Addr) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "weirtest"})
	hooks := map[string]*nftables.ChainHook{"forward": nftables.ChainHookForward, "output": nftables.ChainHookOutput}
	for name, hook := range hooks {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: tbl, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.AsSlice()},
			&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}, // port unreachable
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestRejectIsRefusedAtOnce checks that an ICMP reject from the node reads
// as ErrRefused at once, every time, although on veth the ICMP error
// usually arrives while connect still holds the socket lock.
func TestRejectIsRefusedAtOnce(t *testing.T) {
	topo := NewT(t, twoPods())
	vip := netip.AddrPortFrom(topo.ServiceCIDR.Addr().Next(), 80)
	addReject(t, topo.Node, vip.Addr())
	for _, ns := range []*Namespace{topo.Client, topo.Node, topo.Pods["a"].NS} {
		for i := range 20 {
			start := time.Now()
			_, err := ns.DialTCP(probeCtx(t), vip)
			if took := time.Since(start); !errors.Is(err, ErrRefused) || took > 200*time.Millisecond {
				t.Fatalf("tcp probe %d from %s: got %v after %v, want ErrRefused at once", i, ns.Name, err, took)
			}
			start = time.Now()
			_, err = ns.AskUDP(probeCtx(t), vip)
			if took := time.Since(start); !errors.Is(err, ErrRefused) || took > 200*time.Millisecond {
				t.Fatalf("udp probe %d from %s: got %v after %v, want ErrRefused at once", i, ns.Name, err, took)
			}
			// The node's own datagram is rejected on its way out: the send
			// fails, which the refusal says.
			if local := errors.Is(err, ErrSendRejected); local != (ns == topo.Node) {
				t.Fatalf("udp probe %d from %s: got %v; want ErrSendRejected only from the node", i, ns.Name, err)
			}
		}
	}
}

// addReject6 makes ns reject everything it forwards or sends to vip over
// IPv6: TCP with a reset, UDP with an ICMPv6 port-unreachable.
func addReject6(t *testing.T, ns *Namespace, vip netip.AddrPort) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: "weirtest"})
	rejects := map[byte]*expr.Reject{
		unix.IPPROTO_TCP: {Type: unix.NFT_REJECT_TCP_RST},
		unix.IPPROTO_UDP: {Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}, // ICMPv6 port unreachable
	}
	hooks := map[string]*nftables.ChainHook{"forward": nftables.ChainHookForward, "output": nftables.ChainHookOutput}
	for name, hook := range hooks {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: tbl, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityFilter})
		for proto, reject := range rejects {
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: vip.Addr().AsSlice()},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(vip.Port())},
				reject,
			}})
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestReject6IsRefusedAtOnce is TestRejectIsRefusedAtOnce over IPv6, with
// a TCP reset for TCP: both read as ErrRefused at once, every time, from
// outside the node, from the node itself and from a pod.
func TestReject6IsRefusedAtOnce(t *testing.T) {
	topo := NewT(t, dualPods())
	vip := netip.AddrPortFrom(topo.ServiceCIDR6.Addr().Next(), 80)
	addReject6(t, topo.Node, vip)
	for _, ns := range []*Namespace{topo.Client, topo.Node, topo.Pods["a"].NS} {
		for i := range 20 {
			start := time.Now()
			_, err := ns.DialTCP(probeCtx(t), vip)
			if took := time.Since(start); !errors.Is(err, ErrRefused) || took > 200*time.Millisecond {
				t.Fatalf("tcp probe %d from %s: got %v after %v, want ErrRefused at once", i, ns.Name, err, took)
			}
			start = time.Now()
			_, err = ns.AskUDP(probeCtx(t), vip)
			if took := time.Since(start); !errors.Is(err, ErrRefused) || took > 200*time.Millisecond {
				t.Fatalf("udp probe %d from %s: got %v after %v, want ErrRefused at once", i, ns.Name, err, took)
			}
		}
	}
	// Another port of the VIP matches no rule and dies at the client.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := topo.Client.DialTCP(ctx, netip.AddrPortFrom(vip.Addr(), 81)); !errors.Is(err, ErrTimeout) {
		t.Errorf("other port: got %v, want ErrTimeout", err)
	}
}
