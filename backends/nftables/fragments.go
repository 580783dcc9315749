package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule fragments: the one home of the rules' nft text. Every rule is
// built by ruleOf from matches, and every match is made by one of the small
// constructors below, which write a piece's text next to its expressions.
// A rule's text and expressions therefore come from the same calls and
// cannot drift apart; fragments_test.go prints the expressions of every
// rule the layout writes and compares the result with its text.
//
// A match reads only registers it loads itself, as nf_tables demands of a
// whole rule, so no match depends on what another left in a register.
// (The firewall rule therefore loads the service key twice: once for
// firewall-ips, once more with the source for firewall-allow.)

// masqueradeMark is the packet mark bit asking the postrouting chain to
// masquerade; kube-proxy's default (0x4000), so takeover keeps CNI
// assumptions intact.
const masqueradeMark = 0x4000

// ipsDstNAT is the conntrack status bit set on connections whose destination
// was rewritten (IPS_DST_NAT).
const ipsDstNAT = 1 << 5

// match is one piece of a rule: its expressions and the nft text standing
// for them.
type match struct {
	text  string
	exprs []expr.Any
}

// join concatenates matches: their texts separated by spaces, their
// expressions in order, in a slice of its own.
func join(parts ...match) match {
	var out match
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.text != "" {
			texts = append(texts, p.text)
		}
		out.exprs = append(out.exprs, p.exprs...)
	}
	out.text = strings.Join(texts, " ")
	return out
}

// extend returns exprs followed by more, never writing into exprs' array:
// a key serves several matches.
func extend(exprs []expr.Any, more ...expr.Any) []expr.Any {
	return append(slices.Clip(exprs), more...)
}

// ruleOf returns the rule the matches make, joined.
func ruleOf(parts ...match) *rule {
	m := join(parts...)
	return &rule{text: m.text, exprs: m.exprs}
}

// field is one field of a lookup key: its text, how many 32-bit registers
// it fills, and the expressions that load it into register reg.
type field struct {
	text  string
	words uint32
	load  func(reg uint32) []expr.Any
}

// key is a concatenation of fields loaded at regKey, one after the other.
// It matches nothing by itself: a lookup, an update or a DNAT reads it.
type key struct {
	text  string
	exprs []expr.Any
}

// keyOf loads the fields at regKey and the registers after it.
func keyOf(fields ...field) key {
	var k key
	texts := make([]string, 0, len(fields))
	reg := uint32(regKey)
	for _, f := range fields {
		k.exprs = extend(k.exprs, f.load(reg)...)
		texts = append(texts, f.text)
		reg += f.words
	}
	k.text = strings.Join(texts, " . ")
	return k
}

func (f *family) daddrField() field {
	return field{f.kw + " daddr", f.addrWords(), func(r uint32) []expr.Any { return []expr.Any{f.loadDaddr(r)} }}
}

func (f *family) saddrField() field {
	return field{f.kw + " saddr", f.addrWords(), func(r uint32) []expr.Any { return []expr.Any{f.loadSaddr(r)} }}
}

func l4protoField() field {
	return field{"meta l4proto", 1, func(r uint32) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r}}
	}}
}

func dportField() field {
	return field{"th dport", 1, func(r uint32) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: r, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
	}}
}

// numgenField is a random number below mod, in host byte order.
func numgenField(mod uint32) field {
	return field{fmt.Sprintf("numgen random mod %d", mod), 1, func(r uint32) []expr.Any {
		return []expr.Any{&expr.Numgen{Register: r, Modulus: mod, Type: unix.NFT_NG_RANDOM}}
	}}
}

// portIDField is a service port's id in an affinity entry (portID), shown
// by the port's name.
func portIDField(port string) field {
	id := portID(port)
	return field{port, 2, func(r uint32) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: r, Data: id[:4]}, &expr.Immediate{Register: r + 1, Data: id[4:]}}
	}}
}

// addrField is the constant address a.
func (f *family) addrField(a netip.Addr) field {
	return field{a.String(), f.addrWords(), func(r uint32) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: r, Data: a.AsSlice()}}
	}}
}

// portField is the constant port p.
func portField(p uint16) field {
	return field{strconv.Itoa(int(p)), 1, func(r uint32) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: r, Data: port16(p)}}
	}}
}

// daddrKey and saddrKey are the packet's addresses alone.
func (f *family) daddrKey() key { return keyOf(f.daddrField()) }
func (f *family) saddrKey() key { return keyOf(f.saddrField()) }

// serviceKey is "ip daddr . meta l4proto . th dport", the key of the
// service-ips map and the sets beside it.
func (f *family) serviceKey() key { return keyOf(f.serviceFields()...) }

func (f *family) serviceFields() []field {
	return []field{f.daddrField(), l4protoField(), dportField()}
}

// nodePortKey is "meta l4proto . th dport", the key of node ports.
func nodePortKey() key { return keyOf(l4protoField(), dportField()) }

// in matches packets whose key is in set.
func (k key) in(set string) match {
	return match{k.text + " @" + set, extend(k.exprs, &expr.Lookup{SourceRegister: regKey, SetName: set})}
}

// notIn matches packets whose key is not in set.
func (k key) notIn(set string) match {
	return match{k.text + " != @" + set, extend(k.exprs, &expr.Lookup{SourceRegister: regKey, SetName: set, Invert: true})}
}

// vmap applies the verdict the verdict map set holds for the key; packets
// whose key it lacks go on.
func (k key) vmap(set string) match {
	return match{k.text + " vmap @" + set, extend(k.exprs,
		&expr.Lookup{SourceRegister: regKey, SetName: set, DestRegister: regVerdict, IsDestRegSet: true})}
}

// update adds the key to the dynamic set, or refreshes it, with the
// timeout in seconds.
func (k key) update(set string, timeout uint32) match {
	return match{fmt.Sprintf("update @%s { %s timeout %ds }", set, k.text, timeout), extend(k.exprs,
		&expr.Dynset{SrcRegKey: regKey, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE,
			Timeout: time.Duration(timeout) * time.Second})}
}

// dnatVia rewrites the destination to the address and port the map holds
// for the key; packets whose key it lacks go on.
func (k key) dnatVia(f *family, set string) match {
	return match{"dnat to " + k.text + " map @" + set, extend(k.exprs,
		&expr.Lookup{SourceRegister: regKey, SetName: set, DestRegister: f.regEP(), IsDestRegSet: true},
		f.dnat(f.regEP()))}
}

// bitSet loads a 32-bit value and matches when it has a bit of mask set.
func bitSet(text string, load expr.Any, mask uint32) match {
	return match{text, []expr.Any{
		load,
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(0)},
	}}
}

// ctNew matches the first packet of a connection.
func ctNew() match {
	return bitSet("ct state new", &expr.Ct{Key: expr.CtKeySTATE, Register: regScratch}, expr.CtStateBitNEW)
}

// ctDNATed matches connections whose destination was NATed.
func ctDNATed() match {
	return bitSet("ct status dnat", &expr.Ct{Key: expr.CtKeySTATUS, Register: regScratch}, ipsDstNAT)
}

// markedForMasquerade matches packets whose mark asks for masquerading.
func markedForMasquerade() match {
	return bitSet(fmt.Sprintf("meta mark & %#x != 0", masqueradeMark),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regScratch}, masqueradeMark)
}

// markMasquerade asks for the packet to be masqueraded: mark | bit is
// (mark & ^bit) ^ bit.
func markMasquerade() match {
	return setMark(fmt.Sprintf("meta mark set meta mark | %#x", masqueradeMark), ^uint32(masqueradeMark), masqueradeMark)
}

// unmarkMasquerade clears the masquerade bit of the packet's mark.
func unmarkMasquerade() match {
	return setMark(fmt.Sprintf("meta mark set meta mark & %#x", ^uint32(masqueradeMark)), ^uint32(masqueradeMark), 0)
}

// setMark sets the packet mark to (mark & mask) ^ xor.
func setMark(text string, mask, xor uint32) match {
	return match{text, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regScratch},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regScratch},
	}}
}

// fromLocal matches packets whose source is an address of this host.
func fromLocal() match { return addrTypeLocal("fib saddr type local", &expr.Fib{FlagSADDR: true}) }

// toLocal matches packets whose destination is an address of this host.
func toLocal() match { return addrTypeLocal("fib daddr type local", &expr.Fib{FlagDADDR: true}) }

func addrTypeLocal(text string, fib *expr.Fib) match {
	fib.Register, fib.ResultADDRTYPE = regScratch, true
	return match{text, []expr.Any{fib,
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}}
}

// isTCP matches TCP packets.
func isTCP() match {
	return match{"meta l4proto tcp", []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte{6}},
	}}
}

// iifname matches packets whose input interface name starts with prefix
// (in) or does not (!in; locally generated packets have no input
// interface).
func iifname(prefix string, in bool) match {
	op, text := expr.CmpOpEq, fmt.Sprintf("iifname %q", prefix+"*")
	if !in {
		op, text = expr.CmpOpNeq, fmt.Sprintf("iifname != %q", prefix+"*")
	}
	return match{text, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regScratch},
		&expr.Cmp{Op: op, Register: regScratch, Data: []byte(prefix)},
	}}
}

// inLoopback matches packets whose address a is (in) or is not (!in) in
// the family's loopback range.
func (f *family) inLoopback(a field, in bool) match {
	op, text := expr.CmpOpEq, a.text+" "+f.loopback.String()
	if !in {
		op, text = expr.CmpOpNeq, a.text+" != "+f.loopback.String()
	}
	mask := make([]byte, f.addrLen)
	for i := range f.loopback.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return match{text, extend(a.load(regScratch),
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: f.addrLen,
			Mask: mask, Xor: make([]byte, f.addrLen)},
		&expr.Cmp{Op: op, Register: regScratch, Data: f.loopback.Addr().AsSlice()})}
}

// numgenBelow matches with probability n/mod: a random number below mod
// is below n.
func numgenBelow(mod, n uint32) match {
	return match{fmt.Sprintf("numgen random mod %d < %d", mod, n), []expr.Any{
		&expr.Numgen{Register: regKey, Modulus: mod, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: regKey, DestRegister: regKey, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Cmp{Op: expr.CmpOpLt, Register: regKey, Data: u32BE(n)},
	}}
}

// verdictDrop drops the packet.
func verdictDrop() match { return match{"drop", []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}} }

// jumpTo continues with chain, then comes back.
func jumpTo(chain string) match {
	return match{"jump " + chain, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}
}

// rejectWithReset answers a TCP packet with a reset.
func rejectWithReset() match {
	return match{"reject with tcp reset", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}}
}

// rejectUnreachable answers with the family's ICMP port unreachable.
func (f *family) rejectUnreachable() match {
	return match{"reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.portUnreachable}}}
}

// masqueradeFully rewrites the source to the outgoing interface's
// address, with a random source port.
func masqueradeFully() match {
	return match{"masquerade fully-random", []expr.Any{&expr.Masq{FullyRandom: true}}}
}

// dnatTo rewrites the destination to ep.
func (f *family) dnatTo(ep netip.AddrPort) match {
	return match{"dnat to " + ep.String(), []expr.Any{
		&expr.Immediate{Register: f.regEP(), Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: regLast, Data: port16(ep.Port())},
		f.dnat(f.regEP()),
	}}
}
