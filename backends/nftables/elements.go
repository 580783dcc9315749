package nftables

import (
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
	a := addr.As4()
	return concat(a[:], []byte{n}, port16(port))
}

// portKey is the element key "protocol . port".
func portKey(proto plan.Protocol, port uint16) []byte {
	n, _ := protoNumber(proto)
	return concat([]byte{n}, port16(port))
}

// bucketKey is the endpoints map key "target . bucket"; numgen writes the
// bucket in host byte order.
func bucketKey(target, bucket uint32) []byte {
	return concat(u32BE(target), binaryutil.NativeEndian.PutUint32(bucket))
}

func endpointValue(ap netip.AddrPort) []byte {
	a := ap.Addr().As4()
	return concat(a[:], port16(ap.Port()))
}

func gotoElement(key []byte, chain string) element {
	return element{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func targetElement(key []byte, target uint32) element {
	return element{Key: key, Val: u32BE(target)}
}

func bucketElement(target, bucket uint32, ep netip.AddrPort) element {
	return element{Key: bucketKey(target, bucket), Val: endpointValue(ep)}
}

func hairpinElement(a netip.Addr) element {
	b := a.As4()
	return element{Key: concat(b[:], b[:])}
}

// allowElement is the firewall-allow range "lb IP . proto . port . range":
// the key holds the range's first address, KeyEnd its last.
func allowElement(ip netip.Addr, proto plan.Protocol, port uint16, r netip.Prefix) element {
	r = r.Masked()
	first, last := r.Addr().As4(), lastAddr(r).As4()
	return element{Key: concat(ipKey(ip, proto, port), first[:]), KeyEnd: concat(ipKey(ip, proto, port), last[:])}
}

// prefixElements encodes CIDRs as interval set elements: each range's first
// address, then the address after its last one flagged as an interval end.
func prefixElements(prefixes []netip.Prefix) []element {
	var out []element
	for _, p := range prefixes {
		p = p.Masked()
		start := p.Addr().As4()
		out = append(out, element{Key: start[:]})
		end := lastAddr(p).Next()
		if end.IsValid() {
			e := end.As4()
			out = append(out, element{Key: e[:], IntervalEnd: true})
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	bits := p.Bits()
	for i := range a {
		for b := 0; b < 8; b++ {
			if i*8+b >= bits {
				a[i] |= 0x80 >> b
			}
		}
	}
	return netip.AddrFrom4(a)
}
