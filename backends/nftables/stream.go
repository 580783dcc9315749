package nftables

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Weir writes its netlink messages itself, straight into the memory they
// are sent from: a transaction's set elements are encoded as they are
// computed, into the messages that carry them, and the blocks holding
// them go to the kernel as they are, one iovec each, in the one sendmsg of
// the batch. Nothing is encoded twice and no block is copied into
// another (kernel.go sends them; encode.go writes the ops).

const (
	nlmsgHeaderLen = unix.SizeofNlMsghdr // 16
	nfgenLen       = 4                   // the nfgenmsg after it: family, version, resource id
	attrHeaderLen  = unix.SizeofNlAttr   // 4
	// firstBlock and lastBlock bound a stream's blocks: a small
	// transaction takes little memory, a large one is not copied while
	// it grows (blocks double up to lastBlock, then stay that size).
	firstBlock = 1 << 10
	lastBlock  = 1 << 20
)

// stream is netlink messages written one after another into blocks of
// memory. A piece written with room never spans two blocks, so lengths
// can be patched in place; messages may.
type stream struct {
	blocks [][]byte
	// size is the bytes written to all blocks.
	size int
}

// mark is where a length field was written, to be patched once known.
type mark struct {
	block, off int
	// at is the stream's size where the length counts from.
	at int
}

// room makes the last block hold n more bytes and returns it.
func (s *stream) room(n int) *[]byte {
	if k := len(s.blocks); k > 0 && cap(s.blocks[k-1])-len(s.blocks[k-1]) >= n {
		return &s.blocks[k-1]
	}
	size := firstBlock
	if k := len(s.blocks); k > 0 {
		size = min(2*cap(s.blocks[k-1]), lastBlock)
	}
	s.blocks = append(s.blocks, make([]byte, 0, max(size, n)))
	return &s.blocks[len(s.blocks)-1]
}

// put appends b, which room has made space for, and counts it.
func (s *stream) put(tail *[]byte, b ...byte) {
	*tail = append(*tail, b...)
	s.size += len(b)
}

// here returns a mark at the next byte written, for a length that starts
// there; n bytes are reserved in one block for what is written first.
func (s *stream) here(n int) mark {
	tail := s.room(n)
	return mark{block: len(s.blocks) - 1, off: len(*tail), at: s.size}
}

// begin starts a message: its netlink header, whose length end patches,
// and its nfgenmsg for family fam.
func (s *stream) begin(typ uint16, flags uint16, fam byte) mark {
	m := s.here(nlmsgHeaderLen + nfgenLen)
	tail := s.room(nlmsgHeaderLen + nfgenLen)
	var h [nlmsgHeaderLen + nfgenLen]byte
	binary.NativeEndian.PutUint16(h[4:], unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	binary.NativeEndian.PutUint16(h[6:], flags|unix.NLM_F_REQUEST)
	h[16], h[17] = fam, unix.NFNETLINK_V0
	s.put(tail, h[:]...)
	return m
}

// end patches the length of the message begun at m.
func (s *stream) end(m mark) {
	binary.NativeEndian.PutUint32(s.blocks[m.block][m.off:], uint32(s.size-m.at))
}

// attr appends an attribute holding the concatenation of parts, padded.
func (s *stream) attr(typ uint16, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	tail := s.room(attrHeaderLen + align4(n))
	var h [attrHeaderLen]byte
	binary.NativeEndian.PutUint16(h[:], uint16(attrHeaderLen+n))
	binary.NativeEndian.PutUint16(h[2:], typ)
	s.put(tail, h[:]...)
	for _, p := range parts {
		s.put(tail, p...)
	}
	var pad [3]byte
	s.put(tail, pad[:align4(n)-n]...)
}

// str appends a NUL-terminated string attribute.
func (s *stream) str(typ uint16, v string) {
	s.attr(typ, []byte(v), []byte{0})
}

// u32 appends a big-endian 32-bit attribute.
func (s *stream) u32(typ uint16, v uint32) {
	s.attr(typ, binary.BigEndian.AppendUint32(nil, v))
}

// nest opens a nested attribute; close patches its length.
func (s *stream) nest(typ uint16) mark {
	m := s.here(attrHeaderLen)
	tail := s.room(attrHeaderLen)
	var h [attrHeaderLen]byte
	binary.NativeEndian.PutUint16(h[2:], typ|unix.NLA_F_NESTED)
	s.put(tail, h[:]...)
	return m
}

// close patches the length of the nested attribute opened at m.
func (s *stream) close(m mark) {
	binary.NativeEndian.PutUint16(s.blocks[m.block][m.off:], uint16(s.size-m.at))
}

func align4(n int) int { return (n + 3) &^ 3 }

// bytes returns the stream's contents in one slice (for decoding in
// tests and text renderings; never on the sync path).
func (s *stream) bytes() []byte {
	out := make([]byte, 0, s.size)
	for _, b := range s.blocks {
		out = append(out, b...)
	}
	return out
}
