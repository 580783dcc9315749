package nftables

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// family is one IP family: its own table (ip weir, ip6 weir) with the same
// layout, and everything in that layout that depends on the address size.
type family struct {
	// kw is the nft keyword: "ip" or "ip6".
	kw       string
	table    nftables.TableFamily
	nfproto  uint32
	addrLen  uint32
	addrType nftables.SetDatatype
	// saddrOff and daddrOff locate the addresses in the network header.
	saddrOff, daddrOff uint32
	loopback           netip.Prefix
	// portUnreachable is the ICMP (or ICMPv6) code a UDP client reads as
	// "connection refused".
	portUnreachable uint8
}

var (
	famV4 = &family{kw: "ip", table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, addrLen: 4,
		addrType: nftables.TypeIPAddr, saddrOff: 12, daddrOff: 16,
		loopback: netip.MustParsePrefix("127.0.0.0/8"), portUnreachable: 3}
	famV6 = &family{kw: "ip6", table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, addrLen: 16,
		addrType: nftables.TypeIP6Addr, saddrOff: 8, daddrOff: 24,
		loopback: netip.MustParsePrefix("::1/128"), portUnreachable: 4}
)

// is reports whether a belongs to the family.
func (f *family) is(a netip.Addr) bool { return a.Is4() == (f.addrLen == 4) }

// number is 4 or 6.
func (f *family) number() int {
	if f.addrLen == 4 {
		return 4
	}
	return 6
}

// addrWords is how many 32-bit registers an address fills.
func (f *family) addrWords() uint32 { return f.addrLen / 4 }

// Registers. nf_tables refuses to read a register that the same rule did not
// write first, so every rule loads what it needs itself. The lookup key
// starts at regKey, a pick chain's bucket right after the key, and the
// endpoint ends at the last register.
const (
	regVerdict = 0
	regScratch = 1  // 16-byte register for marks, flags and single addresses
	regKey     = 8  // NFT_REG32_00: first word of a concatenated lookup key
	regLast    = 23 // NFT_REG32_15
)

// regEP holds the endpoint address; its port is in regLast.
func (f *family) regEP() uint32 { return regLast - f.addrWords() }

func (f *family) loadDaddr(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen}
}

func (f *family) loadSaddr(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen}
}

// dnat rewrites the destination to the address in reg and port in regLast.
func (f *family) dnat(reg uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto, RegAddrMin: reg, RegProtoMin: regLast, Specified: true}
}

// Set types of the family.
func (f *family) ipKeyType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService)
}

func (f *family) addrPortType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetService)
}

// hairpinType is the hairpin set's key: "saddr . daddr . l4proto . dport".
func (f *family) hairpinType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, f.addrType, nftables.TypeInetProto, nftables.TypeInetService)
}

func (f *family) allowType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService, f.addrType)
}
