package conntrack

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/test/netns"
)

// rules is a small nftables table in a test namespace: a DNAT chain and a
// filter chain, each rewritten whole by the test.
type rules struct {
	c       *nftables.Conn
	table   *nftables.Table
	nat     *nftables.Chain
	forward *nftables.Chain
}

// newRules creates table ip weirct with an empty nat prerouting chain and an
// empty filter forward chain in ns, and deletes it when the test ends. The
// nat chain alone turns connection tracking on in the namespace.
func newRules(t *testing.T, ns *netns.Namespace) *rules {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	r := &rules{c: c, table: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "weirct"}}
	c.AddTable(r.table)
	r.nat = c.AddChain(&nftables.Chain{Name: "prerouting", Table: r.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	r.forward = c.AddChain(&nftables.Chain{Name: "forward", Table: r.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	if err := c.Flush(); err != nil {
		t.Fatalf("nftables: %v", err)
	}
	t.Cleanup(func() {
		c.DelTable(r.table)
		if err := c.Flush(); err != nil {
			t.Errorf("nftables cleanup: %v", err)
		}
	})
	return r
}

// set replaces the rules of chain, in one transaction.
func (r *rules) set(t *testing.T, chain *nftables.Chain, rules ...[]expr.Any) {
	t.Helper()
	r.c.FlushChain(chain)
	for _, exprs := range rules {
		r.c.AddRule(&nftables.Rule{Table: r.table, Chain: chain, Exprs: exprs})
	}
	if err := r.c.Flush(); err != nil {
		t.Fatalf("nftables: %v", err)
	}
}

// matchUDP is `ip daddr A udp dport P`.
func matchUDP(dst netip.AddrPort) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, dst.Port())},
	}
}

// dnat is `ip daddr A udp dport P dnat to B:Q`.
func dnat(dst, to netip.AddrPort) []expr.Any {
	return append(matchUDP(dst),
		&expr.Immediate{Register: 1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	)
}

// drop is `ip daddr A udp dport P drop`.
func drop(dst netip.AddrPort) []expr.Any {
	return append(matchUDP(dst), &expr.Verdict{Kind: expr.VerdictDrop})
}

// entries lists the conntrack entries of ns, formatted like entry.String,
// read with this package's own dump.
func entries(t *testing.T, ns *netns.Namespace) []string {
	t.Helper()
	var out []string
	dumpEntries(t, ns, func(e entry) { out = append(out, e.String()) })
	return out
}

// dumpEntries reads every conntrack entry of ns with this package's own
// dump and hands each to visit; an entry that does not parse fails t.
func dumpEntries(t *testing.T, ns *netns.Namespace, visit func(entry)) {
	t.Helper()
	c, err := dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	release, err := c.bind(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	_, err = c.dump(func(b []byte) {
		e, ok, err := parseEntry(b, func(tuple) bool { return true })
		if err != nil || !ok {
			t.Errorf("parse entry: %v", err)
			return
		}
		visit(e)
	})
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
}

// testCtx bounds one step of a test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
