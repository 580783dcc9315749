package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/sdk/plan"
)

// protoNumber returns the IANA protocol number of p.
func protoNumber(p plan.Protocol) (byte, error) {
	switch p {
	case plan.TCP:
		return 6, nil
	case plan.UDP:
		return 17, nil
	case plan.SCTP:
		return 132, nil
	}
	return 0, fmt.Errorf("unsupported protocol %q", p)
}

func port16(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

// ipKey is the element key "address . protocol . port".
func ipKey(addr netip.Addr, proto plan.Protocol, port uint16) []byte {
	n, _ := protoNumber(proto)
	return concat(addr.AsSlice(), []byte{n}, port16(port))
}

// portKey is the element key "protocol . port".
func portKey(proto plan.Protocol, port uint16) []byte {
	n, _ := protoNumber(proto)
	return concat([]byte{n}, port16(port))
}

// bucketKey is the endpoints map key "entry key . bucket"; numgen writes
// the bucket in host byte order.
func bucketKey(key []byte, bucket uint32) []byte {
	return concat(key, binaryutil.NativeEndian.PutUint32(bucket))
}

func endpointValue(ap netip.AddrPort) []byte {
	return concat(ap.Addr().AsSlice(), port16(ap.Port()))
}

func gotoElement(key []byte, chain string) element {
	return element{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func bucketElement(key []byte, bucket uint32, ep netip.AddrPort) element {
	return element{Key: bucketKey(key, bucket), Val: endpointValue(ep)}
}

// addrElement is an element of a set of addresses.
func addrElement(a netip.Addr) element { return element{Key: a.AsSlice()} }

func hairpinElement(a netip.Addr) element {
	return element{Key: concat(a.AsSlice(), a.AsSlice())}
}

// allowElement is the firewall-allow range "lb IP . proto . port . range":
// the key holds the range's first address, KeyEnd its last.
func allowElement(ip netip.Addr, proto plan.Protocol, port uint16, r netip.Prefix) element {
	r = r.Masked()
	return element{Key: concat(ipKey(ip, proto, port), r.Addr().AsSlice()),
		KeyEnd: concat(ipKey(ip, proto, port), lastAddr(r).AsSlice())}
}

// prefixElements encodes CIDRs as interval set elements: each range's first
// address, then the address after its last one flagged as an interval end.
func prefixElements(prefixes []netip.Prefix) []element {
	var out []element
	for _, p := range prefixes {
		p = p.Masked()
		out = append(out, element{Key: p.Addr().AsSlice()})
		if end := lastAddr(p).Next(); end.IsValid() {
			out = append(out, element{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	for i := p.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}

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
