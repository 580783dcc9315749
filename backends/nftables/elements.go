package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/weirproxy/weir/sdk/plan"
)

// element is one set or map element: what its netlink attributes carry.
// Elements are encoded into an elemList as they are made (elemlist.go);
// this form is for what is not on the sync's hot path and for decoding.
type element struct {
	key, keyEnd, val []byte
	// verdict is the chain a verdict map's element goes to.
	verdict string
	comment string
	// intervalEnd flags the element ending a range of an interval set.
	intervalEnd bool
}

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

// elemKey is an entry's key: "address . protocol . port" or "protocol .
// port", each field padded to 32 bits, held without a heap allocation.
type elemKey struct {
	b [24]byte
	n uint8
}

// bytes returns the key's bytes.
func (k *elemKey) bytes() []byte { return k.b[:k.n] }

// ipElemKey is the element key "address . protocol . port".
func ipElemKey(addr netip.Addr, proto plan.Protocol, port uint16) elemKey {
	var k elemKey
	k.n = uint8(len(appendAddr(k.b[:0], addr)))
	k.putProtoPort(proto, port)
	return k
}

// portElemKey is the element key "protocol . port".
func portElemKey(proto plan.Protocol, port uint16) elemKey {
	var k elemKey
	k.putProtoPort(proto, port)
	return k
}

func (k *elemKey) putProtoPort(proto plan.Protocol, port uint16) {
	k.b[k.n], _ = protoNumber(proto)
	binary.BigEndian.PutUint16(k.b[k.n+4:], port)
	k.n += 8
}

// appendAddr appends the address's bytes (4 or 16).
func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(b, v[:]...)
	}
	v := a.As16()
	return append(b, v[:]...)
}

// appendEndpoint appends "address . port", the port padded to 32 bits.
func appendEndpoint(b []byte, ap netip.AddrPort) []byte {
	b = appendAddr(b, ap.Addr())
	return append(b, byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
}

// appendBucket appends a bucket number as numgen writes it: host byte order.
func appendBucket(b []byte, bucket uint32) []byte {
	return binary.NativeEndian.AppendUint32(b, bucket)
}

// allowElement is the firewall-allow range "lb IP . proto . port . range":
// the key holds the range's first address, keyEnd its last.
func allowElement(ip netip.Addr, proto plan.Protocol, port uint16, r netip.Prefix) element {
	r = r.Masked()
	k := ipElemKey(ip, proto, port)
	return element{key: appendAddr(append([]byte(nil), k.bytes()...), r.Addr()),
		keyEnd: appendAddr(append([]byte(nil), k.bytes()...), lastAddr(r))}
}

// prefixElements encodes CIDRs as interval set elements: each range's first
// address, then the address after its last one flagged as an interval end.
func prefixElements(prefixes []netip.Prefix) []element {
	var out []element
	for _, p := range prefixes {
		p = p.Masked()
		out = append(out, element{key: p.Addr().AsSlice()})
		if end := lastAddr(p).Next(); end.IsValid() {
			out = append(out, element{key: end.AsSlice(), intervalEnd: true})
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

func port16(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

// bucketKey is the endpoints map key "entry key . bucket".
func bucketKey(key []byte, bucket uint32) []byte {
	return appendBucket(append([]byte(nil), key...), bucket)
}
