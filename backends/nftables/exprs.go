package nftables

import (
	"encoding/binary"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// masqueradeMark is the packet mark bit asking the postrouting chain to
// masquerade; kube-proxy's default (0x4000), so takeover keeps CNI
// assumptions intact.
const masqueradeMark = 0x4000

// ipsDstNAT is the conntrack status bit set on connections whose destination
// was rewritten (IPS_DST_NAT).
const ipsDstNAT = 1 << 5

func loadL4Proto(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }

func loadDport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// portKeyExprs loads "meta l4proto . th dport" starting at regKey.
func portKeyExprs() []expr.Any {
	return []expr.Any{loadL4Proto(regKey), loadDport(regKey + 1)}
}

// lookup matches when the key in sreg is in set (or not, when invert).
func lookup(sreg uint32, set string, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: sreg, SetName: set, Invert: invert}
}

// mapTo looks sreg up in a map, storing the value in dreg (the verdict
// register for verdict maps).
func mapTo(sreg uint32, set string, dreg uint32) expr.Any {
	return &expr.Lookup{SourceRegister: sreg, SetName: set, DestRegister: dreg, IsDestRegSet: true}
}

// markBitSet matches packets whose mark has bit set.
func markBitSet(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regScratch},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// setMarkBit ors bit into the packet mark (or clears it when clear is set).
func setMarkBit(bit uint32, clear bool) []expr.Any {
	mask, xor := ^uint32(0), bit // mark | bit == (mark & ~bit) ^ bit
	mask &^= bit
	if clear {
		xor = 0
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regScratch},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regScratch},
	}
}

// ctStatusDNAT matches connections whose destination was NATed.
func ctStatusDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: regScratch},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctStateNew matches the first packet of a connection.
func ctStateNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: regScratch},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// iifnameNotPrefix matches packets whose input interface name does not start
// with prefix (locally generated packets have no input interface).
func iifnameNotPrefix(prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regScratch, Data: []byte(prefix)},
	}
}

// iifnamePrefix matches packets whose input interface name starts with prefix.
func iifnamePrefix(prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte(prefix)},
	}
}

// saddrLocal matches packets whose source is an address of this host.
func saddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: regScratch, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// daddrLocal matches destinations that are addresses of this host.
func daddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: regScratch, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

func masquerade() expr.Any { return &expr.Masq{FullyRandom: true} }

func isTCP() []expr.Any {
	return []expr.Any{loadL4Proto(regScratch), &expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte{6}}}
}

func rejectTCPReset() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

func drop() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func u32BE(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out
}
