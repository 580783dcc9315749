package nftables

import (
	"encoding/binary"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// gotoCode is NFT_GOTO, a negative verdict code, as the kernel reads it.
var gotoCode = uint32(0x100000000 + unix.NFT_GOTO)

// maxListBytes bounds the element list of one message, well under the 64
// KiB a netlink attribute's 16-bit length allows.
const maxListBytes = 60000

// elemList is the elements a transaction adds to or deletes from one set,
// encoded as they are added into the NEWSETELEM or DELSETELEM messages
// that carry them to the kernel.
type elemList struct {
	table *nftables.Table
	set   string
	del   bool
	s     stream
	// n counts the elements.
	n int
	// open is set while a message takes elements: msg is its start and
	// list its element list attribute.
	open      bool
	msg, list mark
}

func newElemList(table *nftables.Table, set string, del bool) *elemList {
	return &elemList{table: table, set: set, del: del}
}

// add encodes e at the end of the list.
func (l *elemList) add(e *element) {
	n := elemSize(e)
	l.reserve(n)
	tail := l.s.room(n)
	*tail = appendElem(*tail, e, n)
	l.s.size += n
	l.n++
}

// addAll adds each element.
func (l *elemList) addAll(elems ...element) *elemList {
	for i := range elems {
		l.add(&elems[i])
	}
	return l
}

// reserve makes the open message take n more bytes of elements, or opens
// a new one.
func (l *elemList) reserve(n int) {
	if l.open && l.s.size-l.list.at+n <= maxListBytes {
		return
	}
	l.finish()
	typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(unix.NLM_F_CREATE)
	if l.del {
		typ, flags = unix.NFT_MSG_DELSETELEM, 0
	}
	l.msg = l.s.begin(typ, flags, byte(l.table.Family))
	l.s.str(unix.NFTA_SET_ELEM_LIST_TABLE, l.table.Name)
	l.s.str(unix.NFTA_SET_ELEM_LIST_SET, l.set)
	l.list = l.s.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	l.open = true
}

// finish closes the open message; the list is then complete.
func (l *elemList) finish() {
	if l.open {
		l.s.close(l.list)
		l.s.end(l.msg)
		l.open = false
	}
}

// Sizes of the element's attributes: a nested attribute holding one
// value, and the verdict of a verdict map's element.
func nestedValueSize(n int) int { return 2*attrHeaderLen + align4(n) }

func verdictSize(chain string) int {
	return 2*attrHeaderLen + attrHeaderLen + 4 + attrHeaderLen + align4(len(chain)+1)
}

// elemSize is the length of e's NFTA_LIST_ELEM attribute.
func elemSize(e *element) int {
	n := attrHeaderLen + nestedValueSize(len(e.key))
	if e.intervalEnd {
		n += attrHeaderLen + 4
	}
	if e.keyEnd != nil {
		n += nestedValueSize(len(e.keyEnd))
	}
	switch {
	case e.verdict != "":
		n += verdictSize(e.verdict)
	case e.val != nil:
		n += nestedValueSize(len(e.val))
	}
	if e.comment != "" {
		n += attrHeaderLen + align4(len(e.comment)+3)
	}
	return n
}

// appendElem appends e's NFTA_LIST_ELEM attribute, n bytes long.
func appendElem(b []byte, e *element, n int) []byte {
	b = appendAttrHeader(b, n, unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED)
	if e.intervalEnd {
		b = appendAttrHeader(b, attrHeaderLen+4, unix.NFTA_SET_ELEM_FLAGS)
		b = binary.BigEndian.AppendUint32(b, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	b = appendNestedValue(b, unix.NFTA_SET_ELEM_KEY, e.key)
	if e.keyEnd != nil {
		b = appendNestedValue(b, nftables.NFTA_SET_ELEM_KEY_END, e.keyEnd)
	}
	switch {
	case e.verdict != "":
		b = appendAttrHeader(b, verdictSize(e.verdict), unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		b = appendAttrHeader(b, verdictSize(e.verdict)-attrHeaderLen, unix.NFTA_DATA_VERDICT|unix.NLA_F_NESTED)
		b = appendAttrHeader(b, attrHeaderLen+4, unix.NFTA_VERDICT_CODE)
		b = binary.BigEndian.AppendUint32(b, gotoCode)
		b = appendAttrHeader(b, attrHeaderLen+len(e.verdict)+1, unix.NFTA_VERDICT_CHAIN)
		b = appendPadded(append(b, e.verdict...), len(e.verdict), 1)
	case e.val != nil:
		b = appendNestedValue(b, unix.NFTA_SET_ELEM_DATA, e.val)
	}
	if e.comment != "" {
		b = appendAttrHeader(b, attrHeaderLen+len(e.comment)+3, unix.NFTA_SET_ELEM_USERDATA)
		b = append(b, byte(userdata.NFTNL_UDATA_SET_ELEM_COMMENT), byte(len(e.comment)+1))
		b = appendPadded(append(b, e.comment...), len(e.comment)+2, 1)
	}
	return b
}

// appendNestedValue appends a nested attribute holding one NFTA_DATA_VALUE.
func appendNestedValue(b []byte, typ uint16, v []byte) []byte {
	b = appendAttrHeader(b, nestedValueSize(len(v)), typ|unix.NLA_F_NESTED)
	b = appendAttrHeader(b, attrHeaderLen+len(v), unix.NFTA_DATA_VALUE)
	return appendPadded(append(b, v...), len(v), 0)
}

func appendAttrHeader(b []byte, n int, typ uint16) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(n))
	return binary.NativeEndian.AppendUint16(b, typ)
}

// appendPadded ends a value of which n bytes were appended: zeros more
// zero bytes (a string's NUL), then the padding to 32 bits.
func appendPadded(b []byte, n, zeros int) []byte {
	for range align4(n+zeros) - n {
		b = append(b, 0)
	}
	return b
}

// elements decodes the list (for the tests' kernel and text renderings).
func (l *elemList) elements() []element {
	l.finish()
	var out []element
	eachMessage(l.s.bytes(), func(m []byte) {
		_ = eachAttr(m[nlmsgHeaderLen+nfgenLen:], func(typ uint16, data []byte) error {
			if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return nil
			}
			return eachAttr(data, func(_ uint16, e []byte) error {
				out = append(out, decodeElem(e))
				return nil
			})
		})
	})
	return out
}

// decodeElem decodes an NFTA_LIST_ELEM attribute's contents.
func decodeElem(b []byte) element {
	var e element
	_ = eachAttr(b, func(typ uint16, data []byte) error {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.key, _ = dataValue(data)
		case nftables.NFTA_SET_ELEM_KEY_END:
			e.keyEnd, _ = dataValue(data)
		case unix.NFTA_SET_ELEM_DATA:
			e.val, _ = dataValue(data)
			e.verdict = verdictChain(data)
		case unix.NFTA_SET_ELEM_FLAGS:
			e.intervalEnd = len(data) == 4 && binary.BigEndian.Uint32(data)&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_USERDATA:
			e.comment, _ = userdata.GetString(data, userdata.NFTNL_UDATA_SET_ELEM_COMMENT)
		}
		return nil
	})
	return e
}

// verdictChain returns the chain of the verdict in an element's data; ""
// for none.
func verdictChain(data []byte) string {
	var chain string
	_ = eachAttr(data, func(t uint16, v []byte) error {
		if t != unix.NFTA_DATA_VERDICT {
			return nil
		}
		return eachAttr(v, func(t uint16, c []byte) error {
			if t == unix.NFTA_VERDICT_CHAIN {
				chain = strings.TrimRight(string(c), "\x00")
			}
			return nil
		})
	})
	return chain
}
