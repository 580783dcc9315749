package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// ctnetlink attribute types (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaProtoInfo  = 4
	ctaID         = 12
	ctaZone       = 18

	ctaProtoInfoTCP      = 1
	ctaProtoInfoTCPState = 1

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	nlaTypeMask = 0x3fff // drops NLA_F_NESTED and NLA_F_NET_BYTEORDER
	nfgenLen    = 4      // struct nfgenmsg
)

var errMalformed = errors.New("malformed ctnetlink message")

// tuple is the part of a conntrack tuple the matcher needs.
type tuple struct {
	proto    uint8
	src, dst netip.AddrPort
}

// entry is one conntrack entry of a dump, parsed just enough to match it.
// Its raw slices point into the receive buffer.
type entry struct {
	family uint8
	orig   tuple
	reply  tuple
	// rawOrig, rawZone and rawID are whole attributes, header included,
	// echoed back to the kernel to delete exactly this entry.
	rawOrig, rawZone, rawID []byte
	// id is the entry's conntrack ID when hasID; tcpState its TCP state
	// (enum tcp_conntrack), 0 for other protocols.
	id       uint32
	hasID    bool
	tcpState uint8
}

// String formats the entry like the conntrack tool, e.g.
// "udp 172.30.0.2:40000 -> 10.96.0.1:53 reply from 10.244.0.11:5353".
func (e *entry) String() string {
	name := fmt.Sprintf("proto-%d", e.orig.proto)
	switch e.orig.proto {
	case 6:
		name = "tcp"
	case 17:
		name = "udp"
	case 132:
		name = "sctp"
	}
	return fmt.Sprintf("%s %s -> %s reply from %s", name, e.orig.src, e.orig.dst, e.reply.src)
}

// match is an entry selected for deletion: the delete request's payload and
// what to name in an error.
type match struct {
	family uint8
	attrs  []byte // CTA_TUPLE_ORIG, CTA_ZONE and CTA_ID, each padded
	entry  string
	why    string // the flow, or the rule, that selected it
}

// key indexes flows by protocol and original destination; addr is the zero
// Addr for node-port flows.
type key struct {
	proto uint8
	addr  netip.Addr
	port  uint16
}

// index finds, for a conntrack entry, the first flow that selects it.
type index struct {
	byDest  map[key][]int // flow indexes, in order
	anyAddr bool          // some flow has a zero destination address
}

// newIndex indexes the valid flows and returns an error for each invalid one.
func newIndex(flows []Flow) (*index, []error) {
	idx := &index{byDest: map[key][]int{}}
	var errs []error
	for i, f := range flows {
		if err := f.validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		k := key{proto: protoNumber(f.Protocol), addr: f.Dest.Addr().Unmap(), port: f.Dest.Port()}
		idx.byDest[k] = append(idx.byDest[k], i)
		idx.anyAddr = idx.anyAddr || !k.addr.IsValid()
	}
	return idx, errs
}

func (x *index) empty() bool { return len(x.byDest) == 0 }

// wants reports whether any flow may select an entry with original tuple t.
func (x *index) wants(t tuple) bool {
	exact, anyAddr := x.flowsFor(t.proto, t.dst)
	return len(exact)+len(anyAddr) > 0
}

// flowsFor returns the flow indexes that may select an entry of protocol
// proto to dst.
func (x *index) flowsFor(proto uint8, dst netip.AddrPort) (exact, anyAddr []int) {
	exact = x.byDest[key{proto: proto, addr: dst.Addr(), port: dst.Port()}]
	if x.anyAddr {
		anyAddr = x.byDest[key{proto: proto, port: dst.Port()}]
	}
	return exact, anyAddr
}

// pick reports whether a flow selects the parsed entry e, and which.
func (x *index) pick(e *entry, flows []Flow) (string, bool) {
	exact, anyAddr := x.flowsFor(e.orig.proto, e.orig.dst)
	for _, list := range [][]int{exact, anyAddr} {
		for _, i := range list {
			if ep := flows[i].Endpoint; !ep.IsValid() || ep.Unmap() == e.reply.src.Addr() {
				return "flow " + flows[i].String(), true
			}
		}
	}
	return "", false
}

// selectEntry parses one dump message (nfgenmsg and attributes) and, when
// wanted accepts its original tuple and pick selects it, returns what
// deleting it takes. Entries wanted rejects are skipped after reading only
// their original tuple.
func selectEntry(msg []byte, wanted func(tuple) bool, pick func(*entry) (string, bool)) (match, bool, error) {
	e, ok, err := parseEntry(msg, wanted)
	if err != nil || !ok {
		return match{}, false, err
	}
	if why, ok := pick(&e); ok {
		return e.toMatch(why), true, nil
	}
	return match{}, false, nil
}

// toMatch copies what deleting the entry needs out of the receive buffer.
func (e *entry) toMatch(why string) match {
	var attrs []byte
	for _, a := range [][]byte{e.rawOrig, e.rawZone, e.rawID} {
		if len(a) == 0 {
			continue
		}
		attrs = append(attrs, a...)
		attrs = append(attrs, make([]byte, align4(len(a))-len(a))...)
	}
	return match{family: e.family, attrs: attrs, entry: e.String(), why: why}
}

// parseEntry parses a dump message. It returns false, without parsing
// further, when wanted rejects the original tuple.
func parseEntry(msg []byte, wanted func(tuple) bool) (e entry, ok bool, err error) {
	if len(msg) < nfgenLen {
		return e, false, errMalformed
	}
	e.family = msg[0]
	var it attrIter
	it.reset(msg[nfgenLen:])
	for it.next() {
		switch it.typ {
		case ctaTupleOrig:
			e.rawOrig = it.raw
			if e.orig, err = parseTuple(it.data); err != nil {
				return e, false, err
			}
			if !wanted(e.orig) {
				return e, false, nil
			}
		case ctaTupleReply:
			if e.reply, err = parseTuple(it.data); err != nil {
				return e, false, err
			}
		case ctaZone:
			e.rawZone = it.raw
		case ctaID:
			e.rawID = it.raw
			if len(it.data) == 4 {
				e.id, e.hasID = binary.BigEndian.Uint32(it.data), true
			}
		case ctaProtoInfo:
			e.tcpState = tcpState(it.data)
		}
	}
	if it.err != nil {
		return e, false, it.err
	}
	if e.rawOrig == nil {
		return e, false, fmt.Errorf("%w: entry without original tuple", errMalformed)
	}
	return e, true, nil
}

// tcpState returns the state a CTA_PROTOINFO payload holds, or 0 (none)
// when it has no CTA_PROTOINFO_TCP.
func tcpState(b []byte) uint8 {
	var it attrIter
	it.reset(b)
	for it.next() {
		if it.typ != ctaProtoInfoTCP {
			continue
		}
		var in attrIter
		in.reset(it.data)
		for in.next() {
			if in.typ == ctaProtoInfoTCPState && len(in.data) == 1 {
				return in.data[0]
			}
		}
	}
	return 0
}

// parseTuple parses a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY payload.
func parseTuple(b []byte) (tuple, error) {
	var t tuple
	var src, dst netip.Addr
	var sport, dport uint16
	var it attrIter
	it.reset(b)
	for it.next() {
		switch it.typ {
		case ctaTupleIP:
			var in attrIter
			in.reset(it.data)
			for in.next() {
				a, ok := netip.AddrFromSlice(in.data)
				if !ok {
					return t, fmt.Errorf("%w: address of %d bytes", errMalformed, len(in.data))
				}
				switch in.typ {
				case ctaIPv4Src, ctaIPv6Src:
					src = a.Unmap()
				case ctaIPv4Dst, ctaIPv6Dst:
					dst = a.Unmap()
				}
			}
			if in.err != nil {
				return t, in.err
			}
		case ctaTupleProto:
			var in attrIter
			in.reset(it.data)
			for in.next() {
				switch {
				case in.typ == ctaProtoNum && len(in.data) == 1:
					t.proto = in.data[0]
				case in.typ == ctaProtoSrcPort && len(in.data) == 2:
					sport = binary.BigEndian.Uint16(in.data)
				case in.typ == ctaProtoDstPort && len(in.data) == 2:
					dport = binary.BigEndian.Uint16(in.data)
				}
			}
			if in.err != nil {
				return t, in.err
			}
		}
	}
	t.src, t.dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	return t, it.err
}

// attrIter walks a run of netlink attributes.
type attrIter struct {
	rest []byte
	typ  uint16
	data []byte // payload
	raw  []byte // header and payload, without padding
	err  error
}

func (it *attrIter) reset(b []byte) { *it = attrIter{rest: b} }

// next advances to the next attribute; at the end or on a malformed
// attribute it returns false, the latter with it.err set.
func (it *attrIter) next() bool {
	if len(it.rest) == 0 {
		return false
	}
	if len(it.rest) < 4 {
		it.err = fmt.Errorf("%w: %d trailing bytes", errMalformed, len(it.rest))
		return false
	}
	n := int(binary.NativeEndian.Uint16(it.rest))
	if n < 4 || n > len(it.rest) {
		it.err = fmt.Errorf("%w: attribute length %d of %d bytes", errMalformed, n, len(it.rest))
		return false
	}
	it.typ = binary.NativeEndian.Uint16(it.rest[2:]) & nlaTypeMask
	it.raw, it.data = it.rest[:n], it.rest[4:n]
	it.rest = it.rest[min(align4(n), len(it.rest)):]
	return true
}

func align4(n int) int { return (n + 3) &^ 3 }
