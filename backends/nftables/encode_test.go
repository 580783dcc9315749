package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// ipKey and portKey return entry keys as slices.
func ipKey(addr netip.Addr, proto plan.Protocol, port uint16) []byte {
	k := ipElemKey(addr, proto, port)
	return append([]byte(nil), k.bytes()...)
}

func portKey(proto plan.Protocol, port uint16) []byte {
	k := portElemKey(proto, port)
	return append([]byte(nil), k.bytes()...)
}

func gotoElement(key []byte, chain string) element { return element{key: key, verdict: chain} }

// addrElement is an element of a set of addresses.
func addrElement(a netip.Addr) element { return element{key: a.AsSlice()} }

// encodingOptions between them make the layout write every kind of set,
// chain and rule.
var encodingOptions = []backends.Common{
	{ClusterCIDRs: goldenCIDRs, LocalhostNodePorts: true},
	{LocalDetector: backends.DetectNodeCIDR, NodePortPrimary: true, MasqueradeAll: true},
	{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth", NodePortCIDRs: goldenCIDRs},
}

// recordedTxns returns, for each option set and family, the recorded
// transactions of a first full sync of seqPlan, a refill of it, and a
// partial sync changing every service.
func recordedTxns(t *testing.T) []*txn {
	var out []*txn
	for _, o := range encodingOptions {
		for _, tb := range newTables(Options{Common: o, Table: "weir"}) {
			p := seqPlan()
			first, c := tb.fullTxn(p, nil)
			c.commit()
			tb.state, tb.synced = c.base, true
			refill, c := tb.fullTxn(p, nil)
			c.commit()
			dropFirstEndpoints(p)
			partial, _ := tb.partialTxn(p, p.Keys(), nil)
			out = append(out, first, refill, partial)
		}
	}
	return out
}

// dropFirstEndpoints changes every service that has endpoints.
func dropFirstEndpoints(p *plan.Plan) {
	for _, s := range p.Services {
		if len(s.Endpoints) > 0 {
			s.Endpoints = s.Endpoints[1:]
		}
	}
}

// TestEncodingMatchesTheLibrary encodes every op of those transactions as
// Weir sends it and as github.com/google/nftables does (the encoding Weir
// used before it wrote its own): the objects' messages must be the
// library's byte for byte but for flags (Weir asks for no
// acknowledgement, nor for rules to be echoed), and the element messages
// must carry the same elements.
func TestEncodingMatchesTheLibrary(t *testing.T) {
	seen := map[opKind]bool{}
	for _, tx := range recordedTxns(t) {
		sets := uint32(0)
		for i, o := range tx.ops {
			seen[o.kind] = true
			b := &batch{setID: sets}
			b.op(tx.table, o)
			if o.kind == opAddSet {
				sets++
				s := *o.set
				s.ID = sets
				o.set = &s
			}
			ours := b.pieces[0].bytes()
			theirs := libraryMessages(t, tx.table, o)
			if o.kind == opAddElems || o.kind == opDelElems {
				if got, want := messageElements(ours), messageElements(theirs); !slices.EqualFunc(got, want, sameElement) {
					t.Fatalf("op %d (%s of %s): the elements differ:\n ours   %v\n theirs %v", i, opName(o), o.set.Name, got, want)
				}
				continue
			}
			if !bytes.Equal(withoutFlags(ours), withoutFlags(theirs)) {
				t.Fatalf("op %d (%s): the messages differ:\n ours   %x\n theirs %x", i, opName(o), ours, theirs)
			}
		}
	}
	for k := opAddTable; k <= opFlushChain; k++ {
		if !seen[k] {
			t.Errorf("no op %s was compared", opName(op{kind: k}))
		}
	}
}

// libraryMessages returns the messages the library's Conn sends for o,
// without the batch's begin and end.
func libraryMessages(t *testing.T, table *nftables.Table, o op) []byte {
	t.Helper()
	var out []byte
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		for _, m := range req {
			if m.Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN) || m.Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_END) {
				continue
			}
			m.Header.Length = uint32(nlmsgHeaderLen + len(m.Data))
			b, err := m.MarshalBinary()
			if err != nil {
				return nil, err
			}
			out = append(out, b...)
		}
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	switch o.kind {
	case opAddTable:
		conn.AddTable(table)
	case opDelTable:
		conn.DelTable(table)
	case opAddChain:
		conn.AddChain(o.chain)
	case opDelChain:
		conn.DelChain(o.chain)
	case opFlushChain:
		conn.FlushChain(o.chain)
	case opAddRule:
		conn.AddRule(&nftables.Rule{Table: table, Chain: o.chain, Exprs: o.rule.exprs})
	case opAddSet:
		err = conn.AddSet(o.set, nil)
	case opDelSet:
		conn.DelSet(o.set)
	case opFlushSet:
		conn.FlushSet(o.set)
	case opAddElems:
		err = conn.SetAddElements(o.set, libraryElements(o.elems.elements()))
	case opDelElems:
		err = conn.SetDeleteElements(o.set, libraryElements(o.elems.elements()))
	}
	if err == nil {
		err = conn.Flush()
	}
	if err != nil {
		t.Fatal(err)
	}
	if o.kind == opAddChain {
		return withChainComment(t, out, o.comment)
	}
	return out
}

// withChainComment appends to a NEWCHAIN message, which the library writes
// without user data, the comment as the nft tool writes it: attribute
// NFTA_CHAIN_USERDATA (12 in linux/netfilter/nf_tables.h) holding the
// string as an NFTNL_UDATA_CHAIN_COMMENT (0) TLV.
func withChainComment(t *testing.T, msg []byte, comment string) []byte {
	t.Helper()
	if comment == "" {
		return msg
	}
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(12, userdata.AppendString(nil, 0, comment))
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out := append(bytes.Clone(msg), attrs...)
	binary.NativeEndian.PutUint32(out, uint32(len(out)))
	return out
}

func libraryElements(elems []element) []nftables.SetElement {
	var out []nftables.SetElement
	for _, e := range elems {
		le := nftables.SetElement{Key: e.key, KeyEnd: e.keyEnd, Val: e.val, IntervalEnd: e.intervalEnd, Comment: e.comment}
		if e.verdict != "" {
			le.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.verdict}
		}
		out = append(out, le)
	}
	return out
}

// withoutFlags returns the messages with their headers' flags, sequence
// numbers and port ids cleared.
func withoutFlags(b []byte) []byte {
	out := bytes.Clone(b)
	off := 0
	eachMessage(b, func(m []byte) {
		clear(out[off+6 : off+nlmsgHeaderLen])
		off += align4(len(m))
	})
	return out
}

// messageElements decodes the elements of element messages.
func messageElements(b []byte) []element {
	l := &elemList{}
	l.s.blocks = [][]byte{b}
	return l.elements()
}

func sameElement(a, b element) bool {
	return bytes.Equal(a.key, b.key) && bytes.Equal(a.keyEnd, b.keyEnd) && bytes.Equal(a.val, b.val) &&
		a.verdict == b.verdict && a.comment == b.comment && a.intervalEnd == b.intervalEnd
}

func opName(o op) string {
	return [...]string{"add table", "delete table", "add chain", "delete chain", "add rule", "add set", "delete set",
		"add elements", "delete elements", "flush set", "flush chain"}[o.kind]
}

// TestStreamedBatchIsTheRecordedOne builds each transaction twice, once
// encoded as it is built (how the backend sends it) and once recorded
// then encoded: the batches must be the same bytes.
func TestStreamedBatchIsTheRecordedOne(t *testing.T) {
	for _, o := range encodingOptions {
		recorded, streamed := newTables(Options{Common: o, Table: "weir"}), newTables(Options{Common: o, Table: "weir"})
		p := seqPlan()
		full := func(tb *table, out *batch) (*txn, *changes) { return tb.fullTxn(p, out) }
		partial := func(tb *table, out *batch) (*txn, *changes) { return tb.partialTxn(p, p.Keys(), out) }
		for i, step := range []func(tb *table, out *batch) (*txn, *changes){full, full, partial} {
			if i == 2 {
				dropFirstEndpoints(p)
			}
			var rec []*txn
			out := &batch{}
			for f := range recorded {
				r, rc := step(recorded[f], nil)
				_, sc := step(streamed[f], out)
				rec = append(rec, r)
				for _, c := range []*changes{rc, sc} {
					c.commit()
				}
				recorded[f].state, recorded[f].synced = rc.base, true
				streamed[f].state, streamed[f].synced = sc.base, true
			}
			want, got := joined(batchOf(rec).frame(1).iov, 0), joined(out.frame(1).iov, 0)
			if !bytes.Equal(got, want) {
				t.Fatalf("%+v, step %d: the streamed batch (%d bytes) is not the recorded one (%d bytes)", o, i, len(got), len(want))
			}
		}
	}
}

// TestFrameJoinsManyPieces gives a batch more element lists than sendmsg
// takes iovecs: it is sent as one piece, every message numbered.
func TestFrameJoinsManyPieces(t *testing.T) {
	table := &nftables.Table{Name: "weir", Family: nftables.TableFamilyIPv4}
	b := &batch{}
	for i := range maxIovecs + 10 {
		e := addrElement(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
		b.op(table, op{kind: opAddElems, elems: newElemList(table, fmt.Sprintf("set-%d", i), false).addAll(e)})
	}
	f := b.frame(1)
	if len(f.iov) != 1 || len(f.iov[0]) != f.size {
		t.Fatalf("%d pieces of %d bytes in all, want one", len(f.iov), f.size)
	}
	var seqs []uint32
	eachMessage(f.iov[0], func(m []byte) { seqs = append(seqs, binary.NativeEndian.Uint32(m[8:])) })
	if len(seqs) != maxIovecs+12 || seqs[0] != 1 || seqs[len(seqs)-1] != uint32(len(seqs)) || f.last != uint32(len(seqs)-1) {
		t.Fatalf("messages numbered %d..%d (%d of them), the last acknowledged %d", seqs[0], seqs[len(seqs)-1], len(seqs), f.last)
	}
}

// TestStickyTemplatesMatchTheFragments fills the sticky rule templates of
// both families with many values: each time the encoding must be that of
// the rule the fragments make for them.
func TestStickyTemplatesMatchTheFragments(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 4))
	for _, tb := range newTables(Options{Table: "weir"}) {
		l := tb.layout
		for range 200 {
			var a [16]byte
			for i := range a {
				a[i] = byte(rng.Uint32())
			}
			addr := netip.AddrFrom16(a)
			if l.fam == famV4 {
				addr = netip.AddrFrom4([4]byte(a[:4]))
			}
			port := fmt.Sprintf("ns-%d/svc/p%d/tcp", rng.Uint32(), rng.Uint32())
			mod := 1 + rng.Uint32N(maxBuckets)
			st := stickyStep{shape: stickyShape(rng.UintN(3)), ep: netip.AddrPortFrom(addr, uint16(rng.Uint32())),
				mod: mod, below: 1 + rng.Uint32N(mod)}
			timeout := 1 + rng.Uint32N(plan.MaxAffinitySeconds)
			var got stream
			got.template(l.template(st.shape), &ruleArgs{portID: portID(port), ep: st.ep, timeout: timeout, mod: st.mod, below: st.below})
			var want []byte
			for _, e := range l.stepRule(port, st, timeout).exprs {
				data, err := expr.Marshal(byte(l.table.Family), e)
				if err != nil {
					t.Fatal(err)
				}
				want = appendAttrHeader(want, attrHeaderLen+len(data), unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED)
				want = appendPadded(append(want, data...), len(data), 0)
			}
			if !bytes.Equal(got.bytes(), want) {
				t.Fatalf("%s, %+v, %s, timeout %d: the template gives\n%x\nthe fragments\n%x", l.fam.kw, st, port, timeout, got.bytes(), want)
			}
		}
	}
}
