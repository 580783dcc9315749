package netns

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
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
		}
	}
}
