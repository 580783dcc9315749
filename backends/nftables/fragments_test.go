package nftables

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/bits"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// The rule text is written once, next to its expressions, in the
// fragment constructors of fragments.go. These tests hold the two
// together: a printer renders the expressions of every fragment and of
// every rule the layout writes, the way the texts are written, and the
// result must be the text. The printer also follows the registers as
// nf_tables does, so a fragment that reads a register it did not load, or
// loads one nobody reads, fails too.

// span is a run of 32-bit register words.
type span struct{ word, n uint32 }

// regWord returns the first 32-bit word of register r: NFT_REG_1 to
// NFT_REG_4 hold 16 bytes each, NFT_REG32_00 on 4 (both counted from the
// verdict register's 16 bytes).
func regWord(r uint32) uint32 {
	if r >= 8 {
		return r - 4
	}
	return r * 4
}

func wordsOf(bytes uint32) uint32 { return (bytes + 3) / 4 }

func regSpan(r, bytes uint32) span { return span{regWord(r), wordsOf(bytes)} }

// setShape gives a set's key and data lengths in bytes, by name; false
// for an unknown set.
type setShape func(name string) (klen, dlen uint32, ok bool)

// exprRegisters returns the register words an expression reads and those
// it writes, in the table's family; an error for an expression Weir does
// not use or a set shape does not know.
func exprRegisters(f *family, e expr.Any, sets setShape) (reads, writes []span, err error) {
	switch x := e.(type) {
	case *expr.Meta:
		n := map[expr.MetaKey]uint32{expr.MetaKeyL4PROTO: 1, expr.MetaKeyMARK: 4, expr.MetaKeyIIFNAME: 16}[x.Key]
		if x.SourceRegister {
			return []span{regSpan(x.Register, n)}, nil, nil
		}
		return nil, []span{regSpan(x.Register, n)}, nil
	case *expr.Payload:
		return nil, []span{regSpan(x.DestRegister, x.Len)}, nil
	case *expr.Ct:
		return nil, []span{regSpan(x.Register, 4)}, nil
	case *expr.Fib:
		return nil, []span{regSpan(x.Register, 4)}, nil
	case *expr.Numgen:
		return nil, []span{regSpan(x.Register, 4)}, nil
	case *expr.Immediate:
		if x.Register == regVerdict {
			return nil, nil, nil
		}
		return nil, []span{regSpan(x.Register, uint32(len(x.Data)))}, nil
	case *expr.Bitwise:
		return []span{regSpan(x.SourceRegister, x.Len)}, []span{regSpan(x.DestRegister, x.Len)}, nil
	case *expr.Byteorder:
		return []span{regSpan(x.SourceRegister, x.Len)}, []span{regSpan(x.DestRegister, x.Len)}, nil
	case *expr.Cmp:
		return []span{regSpan(x.Register, uint32(len(x.Data)))}, nil, nil
	case *expr.Lookup:
		klen, dlen, ok := sets(x.SetName)
		if !ok {
			return nil, nil, fmt.Errorf("lookup in unknown set %s", x.SetName)
		}
		if x.IsDestRegSet && x.DestRegister != regVerdict {
			writes = []span{regSpan(x.DestRegister, dlen)}
		}
		return []span{regSpan(x.SourceRegister, klen)}, writes, nil
	case *expr.Dynset:
		klen, _, ok := sets(x.SetName)
		if !ok {
			return nil, nil, fmt.Errorf("update of unknown set %s", x.SetName)
		}
		return []span{regSpan(x.SrcRegKey, klen)}, nil, nil
	case *expr.NAT:
		return []span{regSpan(x.RegAddrMin, f.addrLen), regSpan(x.RegProtoMin, 2)}, nil, nil
	case *expr.Verdict, *expr.Reject, *expr.Masq:
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("expression %T is not one Weir writes", e)
}

// layoutSets returns the shapes of the layout's sets: the base ones and
// every endpoints map.
func layoutSets(l *layout) setShape {
	t := &txn{table: l.table}
	l.base(t, false)
	byName := map[string]*nftables.Set{}
	for _, o := range t.ops {
		if o.kind == opAddSet {
			byName[o.set.Name] = o.set
		}
	}
	// Those that only some options create.
	for _, name := range []string{setClusterCIDRs, setPodCIDRs, setNodePortCIDRs} {
		byName[name] = l.intervalSet(name)
	}
	return func(name string) (uint32, uint32, bool) {
		s := byName[name]
		if m, ok := parseEndpointsMap(name); ok {
			s = l.endpointsMap(m)
		}
		if s == nil {
			return 0, 0, false
		}
		return s.KeyType.Bytes, s.DataType.Bytes, true
	}
}

// regValue is what a register holds, for the printer: its text and what
// loaded it, as changed by bitwise and byteorder expressions.
type regValue struct {
	text      string
	load      expr.Any
	words     uint32
	mask, xor []byte
	hton      bool
	mapped    bool // a map's value
	read      bool
}

// printer renders expressions as the fragments' text.
type printer struct {
	f     *family
	sets  setShape
	ports map[string]string // hex of a port id → the port's name
	regs  map[uint32]*regValue
	out   []string
}

func newPrinter(f *family, sets setShape, ports map[string]string) *printer {
	return &printer{f: f, sets: sets, ports: ports, regs: map[uint32]*regValue{}}
}

// print renders exprs; an error for an expression or register use the
// fragments do not write.
func (p *printer) print(exprs []expr.Any) (string, error) {
	for i, e := range exprs {
		if err := p.expr(e); err != nil {
			return "", fmt.Errorf("expression %d (%T): %w", i+1, e, err)
		}
	}
	for w, v := range p.regs {
		if !v.read {
			return "", fmt.Errorf("%q loaded at word %d is never read", v.text, w)
		}
	}
	return strings.Join(p.out, " "), nil
}

func (p *printer) write(r uint32, v *regValue) error {
	w := regWord(r)
	for at, old := range p.regs {
		if at < w+v.words && w < at+old.words {
			if !old.read {
				return fmt.Errorf("%q is overwritten unread", old.text)
			}
			delete(p.regs, at)
		}
	}
	p.regs[w] = v
	return nil
}

// readRegs returns the values filling bytes from register r, which must
// cover them exactly.
func (p *printer) readRegs(r, bytes uint32) ([]*regValue, error) {
	var out []*regValue
	end := regWord(r) + wordsOf(bytes)
	for w := regWord(r); w < end; {
		v := p.regs[w]
		if v == nil {
			return nil, fmt.Errorf("reads word %d, which the rule did not load", w)
		}
		v.read = true
		out = append(out, v)
		w += v.words
		if w > end {
			return nil, fmt.Errorf("reads part of %q", v.text)
		}
	}
	return out, nil
}

func (p *printer) readOne(r, bytes uint32) (*regValue, error) {
	vs, err := p.readRegs(r, bytes)
	if err == nil && len(vs) != 1 {
		err = fmt.Errorf("reads %d values where one is expected", len(vs))
	}
	if err != nil {
		return nil, err
	}
	return vs[0], nil
}

func (p *printer) expr(e expr.Any) error {
	switch x := e.(type) {
	case *expr.Meta:
		return p.meta(x)
	case *expr.Payload, *expr.Ct, *expr.Fib, *expr.Numgen, *expr.Immediate:
		return p.load(e)
	case *expr.Bitwise:
		v, err := p.readOne(x.SourceRegister, x.Len)
		if err != nil {
			return err
		}
		return p.write(x.DestRegister, &regValue{text: v.text, load: v.load, words: v.words, mask: x.Mask, xor: x.Xor})
	case *expr.Byteorder:
		v, err := p.readOne(x.SourceRegister, x.Len)
		if err != nil || x.Op != expr.ByteorderHton {
			return cmpOr(err, "byteorder other than hton")
		}
		return p.write(x.DestRegister, &regValue{text: v.text, load: v.load, words: v.words, hton: true})
	case *expr.Cmp:
		return p.cmp(x)
	case *expr.Lookup:
		return p.lookup(x)
	case *expr.Dynset:
		return p.dynset(x)
	case *expr.NAT:
		return p.nat(x)
	}
	text, err := p.statement(e)
	p.out = append(p.out, text)
	return err
}

// cmpOr returns err, or an error saying what when err is nil.
func cmpOr(err error, what string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%s", what)
}

func (p *printer) meta(x *expr.Meta) error {
	if !x.SourceRegister {
		return p.load(x)
	}
	v, err := p.readOne(x.Register, 4)
	if err != nil {
		return err
	}
	m, ok := v.load.(*expr.Meta)
	if x.Key != expr.MetaKeyMARK || !ok || m.Key != expr.MetaKeyMARK || v.mask == nil {
		return fmt.Errorf("sets the mark from %q", v.text)
	}
	mask, xor := binaryutil.NativeEndian.Uint32(v.mask), binaryutil.NativeEndian.Uint32(v.xor)
	switch {
	case xor == 0:
		p.out = append(p.out, fmt.Sprintf("meta mark set meta mark & %#x", mask))
	case mask == ^xor:
		p.out = append(p.out, fmt.Sprintf("meta mark set meta mark | %#x", xor))
	default:
		return fmt.Errorf("sets the mark with mask %#x xor %#x", mask, xor)
	}
	return nil
}

// load records what a loading expression puts in its register.
func (p *printer) load(e expr.Any) error {
	_, writes, err := exprRegisters(p.f, e, p.sets)
	if err != nil {
		return err
	}
	text, err := p.loadText(e)
	if err != nil {
		return err
	}
	w := writes[0]
	return p.write(regOf(e), &regValue{text: text, load: e, words: w.n})
}

// regOf returns the register a loading expression writes.
func regOf(e expr.Any) uint32 {
	switch x := e.(type) {
	case *expr.Meta:
		return x.Register
	case *expr.Payload:
		return x.DestRegister
	case *expr.Ct:
		return x.Register
	case *expr.Fib:
		return x.Register
	case *expr.Numgen:
		return x.Register
	case *expr.Immediate:
		return x.Register
	}
	return 0
}

func (p *printer) loadText(e expr.Any) (string, error) {
	switch x := e.(type) {
	case *expr.Meta:
		if t, ok := map[expr.MetaKey]string{expr.MetaKeyL4PROTO: "meta l4proto", expr.MetaKeyMARK: "meta mark",
			expr.MetaKeyIIFNAME: "iifname"}[x.Key]; ok {
			return t, nil
		}
	case *expr.Payload:
		return p.payloadText(x)
	case *expr.Ct:
		if t, ok := map[expr.CtKey]string{expr.CtKeySTATE: "ct state", expr.CtKeySTATUS: "ct status"}[x.Key]; ok {
			return t, nil
		}
	case *expr.Fib:
		if x.ResultADDRTYPE && x.FlagSADDR != x.FlagDADDR {
			return map[bool]string{true: "fib saddr type", false: "fib daddr type"}[x.FlagSADDR], nil
		}
	case *expr.Numgen:
		if x.Type == unix.NFT_NG_RANDOM && x.Offset == 0 {
			return fmt.Sprintf("numgen random mod %d", x.Modulus), nil
		}
	case *expr.Immediate:
		return p.constText(x.Data), nil
	}
	return "", fmt.Errorf("loads %#v", e)
}

func (p *printer) payloadText(x *expr.Payload) (string, error) {
	switch {
	case x.Base == expr.PayloadBaseNetworkHeader && x.Len == p.f.addrLen && x.Offset == p.f.daddrOff:
		return p.f.kw + " daddr", nil
	case x.Base == expr.PayloadBaseNetworkHeader && x.Len == p.f.addrLen && x.Offset == p.f.saddrOff:
		return p.f.kw + " saddr", nil
	case x.Base == expr.PayloadBaseTransportHeader && x.Offset == 2 && x.Len == 2:
		return "th dport", nil
	}
	return "", fmt.Errorf("loads payload %#v", x)
}

// constText renders a constant: a port, an address of the family, or
// half of a port id.
func (p *printer) constText(b []byte) string {
	switch {
	case len(b) == 2:
		return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
	case len(b) == int(p.f.addrLen):
		a, _ := netip.AddrFromSlice(b)
		return a.String()
	}
	return "0x" + hex.EncodeToString(b)
}

// keyText joins the values of a key with " . ", showing a port id (two
// 4-byte constants) by its port's name.
func (p *printer) keyText(vs []*regValue) string {
	var parts []string
	for i := 0; i < len(vs); i++ {
		if i+1 < len(vs) {
			a, aok := vs[i].load.(*expr.Immediate)
			b, bok := vs[i+1].load.(*expr.Immediate)
			if aok && bok && len(a.Data) == 4 && len(b.Data) == 4 {
				if name, ok := p.ports[hex.EncodeToString(append(slices.Clone(a.Data), b.Data...))]; ok {
					parts = append(parts, name)
					i++
					continue
				}
			}
		}
		parts = append(parts, vs[i].text)
	}
	return strings.Join(parts, " . ")
}

func (p *printer) cmp(x *expr.Cmp) error {
	// A comparison may read the start of a value: a name's prefix.
	v := p.regs[regWord(x.Register)]
	if v == nil || v.words < wordsOf(uint32(len(x.Data))) {
		return fmt.Errorf("compares word %d, which the rule did not load", regWord(x.Register))
	}
	v.read = true
	text, err := p.cmpText(x, v)
	p.out = append(p.out, text)
	return err
}

func (p *printer) cmpText(x *expr.Cmp, v *regValue) (string, error) {
	neq := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= "}
	op, known := neq[x.Op]
	zero := slices.Equal(x.Data, make([]byte, len(x.Data)))
	switch l := v.load.(type) {
	case *expr.Ct:
		bit := binaryutil.NativeEndian.Uint32(v.mask)
		name := map[string]string{fmt.Sprintf("ct state %#x", expr.CtStateBitNEW): "new", fmt.Sprintf("ct status %#x", ipsDstNAT): "dnat"}[fmt.Sprintf("%s %#x", v.text, bit)]
		if x.Op == expr.CmpOpNeq && zero && name != "" && slices.Equal(v.xor, make([]byte, 4)) {
			return v.text + " " + name, nil
		}
	case *expr.Meta:
		return p.metaCmp(x, v, l, op, known, zero)
	case *expr.Fib:
		if x.Op == expr.CmpOpEq && binaryutil.NativeEndian.Uint32(x.Data) == unix.RTN_LOCAL && v.mask == nil {
			return v.text + " local", nil
		}
	case *expr.Payload:
		if a, ok := netip.AddrFromSlice(x.Data); ok && known && v.mask != nil {
			n := 0
			for _, b := range v.mask {
				n += bits.OnesCount8(b)
			}
			return v.text + " " + op + netip.PrefixFrom(a, n).String(), nil
		}
	case *expr.Numgen:
		if x.Op == expr.CmpOpLt && v.hton && len(x.Data) == 4 {
			return fmt.Sprintf("%s < %d", v.text, binary.BigEndian.Uint32(x.Data)), nil
		}
	}
	return "", fmt.Errorf("compares %q (mask %x) %v %x", v.text, v.mask, x.Op, x.Data)
}

func (p *printer) metaCmp(x *expr.Cmp, v *regValue, l *expr.Meta, op string, known, zero bool) (string, error) {
	switch {
	case l.Key == expr.MetaKeyMARK && x.Op == expr.CmpOpNeq && zero && v.mask != nil:
		return fmt.Sprintf("meta mark & %#x != 0", binaryutil.NativeEndian.Uint32(v.mask)), nil
	case l.Key == expr.MetaKeyL4PROTO && x.Op == expr.CmpOpEq && len(x.Data) == 1 && v.mask == nil:
		return "meta l4proto " + protoText(x.Data[0]), nil
	case l.Key == expr.MetaKeyIIFNAME && known && len(x.Data) < 16 && v.mask == nil:
		return fmt.Sprintf("iifname %s%q", op, string(x.Data)+"*"), nil
	}
	return "", fmt.Errorf("compares %q %v %x", v.text, x.Op, x.Data)
}

func (p *printer) lookup(x *expr.Lookup) error {
	klen, dlen, _ := p.sets(x.SetName)
	vs, err := p.readRegs(x.SourceRegister, klen)
	if err != nil {
		return err
	}
	k := p.keyText(vs)
	switch {
	case x.IsDestRegSet && x.DestRegister == regVerdict:
		p.out = append(p.out, k+" vmap @"+x.SetName)
	case x.IsDestRegSet:
		return p.write(x.DestRegister, &regValue{text: k + " map @" + x.SetName, load: x, words: wordsOf(dlen), mapped: true})
	case x.Invert:
		p.out = append(p.out, k+" != @"+x.SetName)
	default:
		p.out = append(p.out, k+" @"+x.SetName)
	}
	return nil
}

func (p *printer) dynset(x *expr.Dynset) error {
	klen, _, _ := p.sets(x.SetName)
	vs, err := p.readRegs(x.SrcRegKey, klen)
	if err != nil {
		return err
	}
	if x.Operation != unix.NFT_DYNSET_OP_UPDATE || x.Timeout%time.Second != 0 || x.Invert || x.Exprs != nil {
		return fmt.Errorf("dynset %#v", x)
	}
	p.out = append(p.out, fmt.Sprintf("update @%s { %s timeout %ds }", x.SetName, p.keyText(vs), x.Timeout/time.Second))
	return nil
}

func (p *printer) nat(x *expr.NAT) error {
	if x.Type != expr.NATTypeDestNAT || x.Family != p.f.nfproto || !x.Specified || x.RegAddrMax != 0 || x.RegProtoMax != 0 {
		return fmt.Errorf("NAT %#v", x)
	}
	addr := p.regs[regWord(x.RegAddrMin)]
	if addr != nil && addr.mapped {
		// A map's address . port value: the port is in its last word.
		if addr.read = true; regWord(x.RegProtoMin) != regWord(x.RegAddrMin)+addr.words-1 {
			return fmt.Errorf("DNAT port is not the map value's")
		}
		p.out = append(p.out, "dnat to "+addr.text)
		return nil
	}
	a, err := p.readOne(x.RegAddrMin, p.f.addrLen)
	if err != nil {
		return err
	}
	port, err := p.readOne(x.RegProtoMin, 2)
	if err != nil {
		return err
	}
	ip, _ := netip.ParseAddr(a.text)
	n, _ := strconv.Atoi(port.text)
	p.out = append(p.out, "dnat to "+netip.AddrPortFrom(ip, uint16(n)).String())
	return nil
}

// statement renders the expressions that end a rule or act on the packet.
func (p *printer) statement(e expr.Any) (string, error) {
	switch x := e.(type) {
	case *expr.Verdict:
		names := map[expr.VerdictKind]string{expr.VerdictDrop: "drop", expr.VerdictAccept: "accept",
			expr.VerdictJump: "jump " + x.Chain, expr.VerdictGoto: "goto " + x.Chain}
		if t, ok := names[x.Kind]; ok {
			return t, nil
		}
	case *expr.Reject:
		switch {
		case x.Type == unix.NFT_REJECT_TCP_RST:
			return "reject with tcp reset", nil
		case x.Type == unix.NFT_REJECT_ICMP_UNREACH && x.Code == p.f.portUnreachable:
			return "reject", nil
		}
	case *expr.Masq:
		if *x == (expr.Masq{FullyRandom: true}) {
			return "masquerade fully-random", nil
		}
	}
	return "", fmt.Errorf("statement %#v", e)
}

// fragmentOptions are backend options that, together, make the layout
// write each of its rules.
var fragmentOptions = []backends.Common{
	{},
	{ClusterCIDRs: goldenCIDRs, LocalhostNodePorts: true},
	{NodePortCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}},
	{NodePortPrimary: true, LocalDetector: backends.DetectNodeCIDR},
	{MasqueradeAll: true, LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth"},
	{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "cali"},
}

// stickyPort is the service port of the sticky chains the tests render.
var stickyPort = portName(plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP})

func portNames(names ...string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		id := portID(n)
		out[hex.EncodeToString(id[:])] = n
	}
	return out
}

// TestFragmentTexts prints every fragment constructor's expressions on
// their own: each must read only what it loads and say what it does.
func TestFragmentTexts(t *testing.T) {
	for _, tb := range newTables(Options{Table: "weir"}) {
		l, f := tb.layout, tb.layout.fam
		ep := netip.AddrPortFrom(netip.MustParseAddr(map[int]string{4: "10.244.0.11", 6: "fd00::11"}[f.number()]), 8080)
		affinity := l.affinityKey(stickyPort, ep)
		pick := keyOf(append(laneIP.keyFields(f), numgenField(3))...)
		fragments := []match{ctNew(), ctDNATed(), markedForMasquerade(), markMasquerade(), unmarkMasquerade(),
			fromLocal(), toLocal(), isTCP(), iifname("veth", true), iifname("veth", false),
			f.inLoopback(f.daddrField(), true), f.inLoopback(f.saddrField(), false), numgenBelow(5, 2),
			verdictDrop(), jumpTo(chainServices), rejectWithReset(), f.rejectUnreachable(), masqueradeFully(),
			f.dnatTo(ep), f.serviceKey().in(setNoEPIPs), f.serviceKey().notIn(setFirewallIPs),
			f.serviceKey().vmap(setServiceIPs), nodePortKey().in(setDropNodePorts), nodePortKey().vmap(setNodePorts),
			f.daddrKey().in(setClusterIPs), f.saddrKey().notIn(setPodCIDRs), keyOf(append([]field{f.saddrField()}, f.serviceFields()...)...).in(setHairpin),
			keyOf(append(f.serviceFields(), f.saddrField())...).notIn(setFirewallAllow),
			affinity.in(setAffinity), affinity.update(setAffinity, 30), pick.dnatVia(f, "endpoints-3"),
			join(ctNew(), toLocal(), verdictDrop()),
		}
		for _, m := range fragments {
			checkText(t, l, m.text, m.exprs)
		}
	}
}

// shapes caches the set shapes of each layout checkText has seen.
var shapes = map[*layout]setShape{}

// checkText fails the test when exprs do not print as text.
func checkText(t *testing.T, l *layout, text string, exprs []expr.Any) {
	t.Helper()
	sets, ok := shapes[l]
	if !ok {
		sets = layoutSets(l)
		shapes[l] = sets
	}
	got, err := newPrinter(l.fam, sets, portNames(stickyPort)).print(exprs)
	switch {
	case err != nil:
		t.Errorf("%s %q: %v", l.fam.kw, text, err)
	case got != text:
		t.Errorf("%s: the text says\n  %s\nbut the expressions do\n  %s", l.fam.kw, text, got)
	}
}

// TestFragmentRulesMatchTheirText prints the expressions of every rule
// the layout writes, under options that between them write all of its
// rules, in both families.
func TestFragmentRulesMatchTheirText(t *testing.T) {
	for _, o := range fragmentOptions {
		for _, tb := range newTables(Options{Common: o, Table: "weir"}) {
			n := 0
			for _, r := range layoutRules(tb.layout) {
				checkText(t, tb.layout, r.text, r.exprs)
				n++
			}
			if n < 40 {
				t.Errorf("%+v, %s: only %d rules rendered", o, tb.layout.fam.kw, n)
			}
		}
	}
}

// layoutRules returns the rules of the base chains, of every pick chain
// kind and of sticky chains of one and of three endpoints.
func layoutRules(l *layout) []*rule {
	t := &txn{table: l.table}
	l.base(t, false)
	for kind := range pickNames {
		l.addPickChain(t, pickSpec{kind: pickKind(kind), weight: 3})
	}
	var out []*rule
	for _, o := range t.ops {
		if o.kind == opAddRule {
			out = append(out, o.rule)
		}
	}
	a, b := netip.MustParseAddr("10.244.0.11"), netip.MustParseAddr("10.244.0.12")
	if l.fam == famV6 {
		a, b = netip.MustParseAddr("fd00::11"), netip.MustParseAddr("fd00::12")
	}
	pools := []pool{{buckets: []netip.AddrPort{netip.AddrPortFrom(a, 80)}},
		{buckets: []netip.AddrPort{netip.AddrPortFrom(a, 80), netip.AddrPortFrom(a, 80), netip.AddrPortFrom(b, 80), netip.AddrPortFrom(b, 81)}}}
	for kind := range pickNames {
		for _, p := range pools {
			out = append(out, l.stickyRules(stickyPort, draw{kind: pickKind(kind), pool: p}, 10800)...)
		}
	}
	return out
}

// TestFragmentRuleTextHasOneHome checks that rules and matches, text and
// expressions together, are made in fragments.go alone: anywhere else
// they are composed from what it makes.
func TestFragmentRuleTextHasOneHome(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "fragments.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok && len(lit.Elts) > 0 {
				if id, ok := lit.Type.(*ast.Ident); ok && (id.Name == "rule" || id.Name == "match") {
					t.Errorf("%s: a %s is written by hand; build it from the fragments of fragments.go", fset.Position(lit.Pos()), id.Name)
				}
			}
			return true
		})
	}
}
