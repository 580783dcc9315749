package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A sticky service has two rules per endpoint, which differ from one
// service to the next only in a few constants. Building each from its
// fragments and encoding its expressions cost most of a full sync of many
// such services, so a transaction encoded as it is built copies the
// encoding of a template rule instead, made by the same fragments for
// sentinel values, and writes each value where the template's was: in the
// immediates, the update's timeout, the draw's modulus and comparison.
// TestStickyTemplatesMatchTheFragments compares the two encodings.

// ruleArgs are the values of one sticky rule.
type ruleArgs struct {
	portID     [8]byte
	ep         netip.AddrPort
	timeout    uint32 // seconds
	mod, below uint32
}

// ruleValue names one of the values.
type ruleValue uint8

const (
	valPortIDHigh ruleValue = iota
	valPortIDLow
	valAddr
	valPort
	valTimeout
	valMod
	valBelow
)

// ruleTemplate is the encoding of a rule's expressions (the contents of
// its NFTA_RULE_EXPRESSIONS) and where each value goes.
type ruleTemplate struct {
	b  []byte
	at []valueAt
}

type valueAt struct {
	off int
	v   ruleValue
}

// bytes returns value v of the arguments as the kernel reads it.
func (a *ruleArgs) bytes(v ruleValue, out []byte) []byte {
	switch v {
	case valPortIDHigh:
		return append(out, a.portID[:4]...)
	case valPortIDLow:
		return append(out, a.portID[4:]...)
	case valAddr:
		return appendAddr(out, a.ep.Addr())
	case valPort:
		return binary.BigEndian.AppendUint16(out, a.ep.Port())
	case valTimeout:
		return binary.BigEndian.AppendUint64(out, uint64((time.Duration(a.timeout) * time.Second).Milliseconds()))
	case valMod:
		return binary.BigEndian.AppendUint32(out, a.mod)
	}
	return binary.BigEndian.AppendUint32(out, a.below)
}

// templateArgs are the sentinel values templates are made for; each
// encodes differently from the others and from every other constant of
// the rules.
func templateArgs(f *family) ruleArgs {
	a := ruleArgs{portID: [8]byte{0x9e, 0x37, 0x79, 0xb9, 0x7f, 0x4a, 0x7c, 0x15}, timeout: 0x0a0b0c0d,
		mod: 0x0f1e2d3c, below: 0x0a1b2c3d}
	a.ep = netip.AddrPortFrom(netip.AddrFrom4([4]byte{0xfe, 0xdc, 0xba, 0x98}), 0x1357)
	if f == famV6 {
		a.ep = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,
			0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87}), 0x1357)
	}
	return a
}

// template returns the layout's template of the per-endpoint sticky rule
// of a shape, made on first use.
func (l *layout) template(shape stickyShape) *ruleTemplate {
	if l.templates[shape] == nil {
		t, err := newTemplate(l, shape)
		if err != nil {
			panic(fmt.Sprintf("nftables: the sticky rule template of shape %d: %v", shape, err))
		}
		l.templates[shape] = t
	}
	return l.templates[shape]
}

// newTemplate encodes the rule of a shape for the sentinel values and
// finds each value in the expression that holds it.
func newTemplate(l *layout, shape stickyShape) (*ruleTemplate, error) {
	args := templateArgs(l.fam)
	r := l.stepRule(templatePort, stickyStep{shape: shape, ep: args.ep, mod: args.mod, below: args.below}, args.timeout)
	// The rule's port name stands for args.portID.
	args.portID = portID(templatePort)
	t := &ruleTemplate{}
	for _, e := range r.exprs {
		data, err := expr.Marshal(byte(l.table.Family), e)
		if err != nil {
			return nil, err
		}
		start := len(t.b) + attrHeaderLen
		t.b = appendAttrHeader(t.b, attrHeaderLen+len(data), unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED)
		t.b = appendPadded(append(t.b, data...), len(data), 0)
		v, ok := heldValue(e, &args)
		if !ok {
			continue
		}
		want := args.bytes(v, nil)
		if bytes.Count(data, want) != 1 {
			return nil, fmt.Errorf("expression %T holds value %d %d times in its encoding", e, v, bytes.Count(data, want))
		}
		t.at = append(t.at, valueAt{off: start + bytes.Index(data, want), v: v})
	}
	return t, nil
}

// templatePort is the service port name templates are made for.
const templatePort = "weir/template/0/tcp"

// heldValue returns the value an expression of a template rule holds;
// false for none.
func heldValue(e expr.Any, a *ruleArgs) (ruleValue, bool) {
	switch x := e.(type) {
	case *expr.Immediate:
		for _, v := range []ruleValue{valPortIDHigh, valPortIDLow, valAddr, valPort} {
			if bytes.Equal(x.Data, a.bytes(v, nil)) {
				return v, true
			}
		}
	case *expr.Dynset:
		return valTimeout, true
	case *expr.Numgen:
		return valMod, true
	case *expr.Cmp:
		return valBelow, x.Op == expr.CmpOpLt
	}
	return 0, false
}

// template appends the template's encoding filled with a's values.
func (s *stream) template(t *ruleTemplate, a *ruleArgs) {
	tail := s.room(len(t.b))
	start := len(*tail)
	*tail = append(*tail, t.b...)
	s.size += len(t.b)
	var v [16]byte
	for _, at := range t.at {
		copy((*tail)[start+at.off:], a.bytes(at.v, v[:0]))
	}
}
