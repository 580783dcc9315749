package hooks

import (
	"encoding/binary"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// Offsets and sizes of docs/plugin-abi.md's batch layout (version 1, which
// never changes) that relay needs beyond what sdk/abi exports.
const (
	batchFlags   = 6  // u16
	batchCount   = 8  // u32
	batchStrings = 12 // u32
	batchNode    = 16 // node name and zone: two str

	recSize         = 0  // u32
	recScheduler    = 5  // u8
	recAffinity     = 16 // u32
	recEndpoints    = 20 // u32
	recKey          = 24 // namespace, name, port name: three str
	recCounts       = 48 // six u16: cluster, external and load-balancer IPs, ranges, labels, annotations
	recEndpointsOff = 60 // u32

	epWeight = 20 // u32
	epID     = 24 // u32
	epStrs   = 28 // node, zone, pod: three str

	strSize   = 8
	addrSize  = 16
	rangeSize = 20
	pairSize  = 16
)

var le = binary.LittleEndian

// relay writes to dst the batch that carries a plugin's validated outputs
// out, for the batch sent holding the services in, on to the next plugin,
// so that the next call need not encode them again, and returns it. dst
// must hold len(sent) bytes; it may be sent itself.
//
// The result is what the SDK's Encoder makes of out but for its string
// area, which keeps every string sent (and so may hold some no record
// uses, in another order): the records are laid out again without gaps,
// each changed service's endpoints in the plugin's order with ids
// 0..n-1. Everything but the weights, the order and number of endpoints,
// the affinity and the scheduler — the fields the plugin may change and
// Decode checked — comes from sent, which Weir wrote, never from output:
// a plugin cannot show the next one labels, names or zones of its own.
func relay(dst, sent, output []byte, in, out []*plan.Service) []byte {
	n := len(in)
	table := abi.HeaderSize + 4*n
	copy(dst[:table], sent[:table])
	w := table
	var scratch []byte
	for i := range n {
		ro := int(le.Uint32(sent[abi.HeaderSize+4*i:]))
		le.PutUint32(dst[abi.HeaderSize+4*i:], uint32(w))
		if out[i] == in[i] {
			size := int(le.Uint32(sent[ro+recSize:]))
			copy(dst[w:w+size], sent[ro:ro+size])
			w += size
			continue
		}
		oo := int(le.Uint32(output[abi.HeaderSize+4*i:]))
		var size int
		size, scratch = relayRecord(dst[w:], sent[ro:], output[oo:], scratch)
		w += size
	}
	strs := int(le.Uint32(sent[batchStrings:]))
	end := w + copy(dst[w:], sent[strs:])
	le.PutUint32(dst[batchStrings:], uint32(w))
	if shift := uint32(strs - w); shift > 0 {
		shiftStrings(dst[:end], n, shift)
	}
	return dst[:end]
}

// relayRecord writes at dst the record sent, changed as the plugin's
// validated record out says, and returns its size. sent's endpoints are
// copied to scratch first, as dst may overlap them.
func relayRecord(dst, sent, out, scratch []byte) (int, []byte) {
	eoff := int(le.Uint32(sent[recEndpointsOff:]))
	eps := sent[eoff : eoff+abi.EndpointSize*int(le.Uint32(sent[recEndpoints:]))]
	scratch = append(scratch[:0], eps...)
	copy(dst[:eoff], sent[:eoff])
	kept := int(le.Uint32(out[recEndpoints:]))
	for j := range kept {
		rec := out[eoff+abi.EndpointSize*j:]
		id := int(le.Uint32(rec[epID:]))
		ep := dst[eoff+abi.EndpointSize*j:]
		copy(ep[:abi.EndpointSize], scratch[abi.EndpointSize*id:])
		le.PutUint32(ep[epWeight:], le.Uint32(rec[epWeight:]))
		le.PutUint32(ep[epID:], uint32(j))
	}
	size := eoff + abi.EndpointSize*kept
	le.PutUint32(dst[recSize:], uint32(size))
	le.PutUint32(dst[recEndpoints:], uint32(kept))
	le.PutUint32(dst[recAffinity:], le.Uint32(out[recAffinity:]))
	dst[recScheduler] = out[recScheduler]
	return size, scratch
}

// shiftStrings moves every string descriptor of a batch of n services
// shift bytes down, after its string area moved so.
func shiftStrings(b []byte, n int, shift uint32) {
	move := func(off, count int) {
		for p := off; p < off+strSize*count; p += strSize {
			if le.Uint32(b[p+4:]) != 0 {
				le.PutUint32(b[p:], le.Uint32(b[p:])-shift)
			}
		}
	}
	move(batchNode, 2)
	for i := range n {
		r := int(le.Uint32(b[abi.HeaderSize+4*i:]))
		move(r+recKey, 3)
		c := func(k int) int { return int(le.Uint16(b[r+recCounts+2*k:])) }
		pairs := r + abi.ServiceHeaderSize + addrSize*(c(0)+c(1)+c(2)) + rangeSize*c(3)
		move(pairs, pairSize/strSize*(c(4)+c(5)))
		eoff := r + int(le.Uint32(b[r+recEndpointsOff:]))
		for j := range int(le.Uint32(b[r+recEndpoints:])) {
			move(eoff+abi.EndpointSize*j+epStrs, 3)
		}
	}
}

// setFull sets or clears a batch's Full flag.
func setFull(b []byte, full bool) {
	flags := le.Uint16(b[batchFlags:]) &^ abi.FlagFull
	if full {
		flags |= abi.FlagFull
	}
	le.PutUint16(b[batchFlags:], flags)
}
