package abi

import "hash/maphash"

// strTable finds strings already written to a batch's string area. It is an
// open-addressing hash table of offsets into the buffer: a miss touches one
// 12-byte slot, which keeps big batches (hundreds of thousands of strings)
// much faster than a map[string]uint32.
type strTable struct {
	seed  maphash.Seed
	slots []strSlot // a power of two long; off 0 marks an empty slot
	n     int
}

type strSlot struct{ hash, off, len uint32 }

// reset empties the table, keeping its size.
func (t *strTable) reset() {
	if t.slots == nil {
		t.seed = maphash.MakeSeed()
		t.slots = make([]strSlot, 1024)
	}
	clear(t.slots)
	t.n = 0
}

// hash returns the hash find needs for s.
func (t *strTable) hash(s string) uint32 { return uint32(maphash.String(t.seed, s)) }

// find returns the offset of s (hashing to h) in buf, or 0 and the slot where it belongs.
func (t *strTable) find(buf []byte, s string, h uint32) (off uint32, slot int) {
	mask := len(t.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.off == 0 {
			return 0, i
		}
		if sl.hash == h && int(sl.len) == len(s) && string(buf[sl.off:sl.off+sl.len]) == s {
			return sl.off, i
		}
	}
}

// add records that s (hashing to h) is at off, in the empty slot found for it.
func (t *strTable) add(slot int, h, off uint32, n int) {
	t.slots[slot] = strSlot{hash: h, off: off, len: uint32(n)}
	t.n++
	if 2*t.n > len(t.slots) {
		t.grow()
	}
}

func (t *strTable) grow() {
	old := t.slots
	t.slots = make([]strSlot, 2*len(old))
	mask := len(t.slots) - 1
	for _, sl := range old {
		if sl.off == 0 {
			continue
		}
		i := int(sl.hash) & mask
		for t.slots[i].off != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = sl
	}
}
