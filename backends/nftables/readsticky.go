package nftables

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// stickyRead is a sticky chain as read back: the kind of traffic it
// serves, its endpoints with their numbers of buckets, and the affinity
// timeout in seconds.
type stickyRead struct {
	kind    pickKind
	eps     []weighted
	timeout uint32
}

// readSticky decodes a sticky chain that vmap sends packets to; nil when
// its rules are not the ones Weir writes for any pool of a kind vmap
// serves.
func (r *reader) readSticky(vmap, chain string) *stickyRead {
	rules := r.d.rules[chain]
	kinds := make([]pickKind, 0, len(pickKinds[vmap]))
	for k := range pickKinds[vmap] {
		kinds = append(kinds, k)
	}
	// The longest names first: "ext-local" must not be read as "ext".
	slices.SortFunc(kinds, func(a, b pickKind) int { return len(pickNames[b]) - len(pickNames[a]) })
	for _, kind := range kinds {
		port, ok := strings.CutPrefix(chain, "sticky-"+pickNames[kind]+"-")
		head := len(r.l.kindRules(kind))
		if !ok || len(rules) < head {
			continue
		}
		s := r.decodeSticky(rules[head:])
		if s == nil {
			continue
		}
		want := r.l.stickyRules(port, draw{kind: kind, pool: s.pool()}, s.timeout)
		if firstDifference(r.l.table.Family, want, rules) < 0 {
			s.kind = kind
			return s
		}
	}
	return nil
}

// decodeSticky reads the endpoints, their weights and the timeout from the
// rules after a sticky chain's kind rules: a rule per endpoint for the
// clients it serves, then one per endpoint drawing it. Only the drawing
// rules are read; readSticky compares all of them with Weir's.
func (r *reader) decodeSticky(rules []*nftables.Rule) *stickyRead {
	if len(rules) == 0 || len(rules)%2 != 0 {
		return nil
	}
	n := len(rules) / 2
	s := &stickyRead{}
	var rest uint32
	for i, rl := range rules[n:] {
		d, ok := r.decodeStickyRule(rl.Exprs)
		if !ok {
			return nil
		}
		w := uint32(1)
		switch {
		case i < n-1:
			w, rest = d.lt, d.mod-d.lt
		case n > 1:
			w = rest
		}
		if w == 0 || w > maxBuckets {
			return nil
		}
		s.timeout = d.timeout
		s.eps = append(s.eps, weighted{ep: d.ep, n: w})
	}
	return s
}

// stickyRuleRead is what one drawing rule of a sticky chain holds.
type stickyRuleRead struct {
	ep      netip.AddrPort
	timeout uint32
	mod, lt uint32
}

func (r *reader) decodeStickyRule(exprs []expr.Any) (stickyRuleRead, bool) {
	var d stickyRuleRead
	var addr netip.Addr
	var port uint16
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Numgen:
			d.mod = e.Modulus
		case *expr.Cmp:
			if e.Op == expr.CmpOpLt && len(e.Data) == 4 {
				d.lt = binary.BigEndian.Uint32(e.Data)
			}
		case *expr.Dynset:
			d.timeout = uint32(e.Timeout / time.Second)
		case *expr.Immediate:
			// The endpoint DNAT rewrites to; the affinity key holds it too.
			switch e.Register {
			case kernelRegister(r.l.fam.regEP()):
				addr, _ = netip.AddrFromSlice(e.Data)
			case kernelRegister(regLast):
				port = binary.BigEndian.Uint16(e.Data)
			}
		}
	}
	d.ep = netip.AddrPortFrom(addr, port)
	return d, addr.IsValid() && d.timeout > 0
}

// pool returns the buckets the read endpoints stand for.
func (s *stickyRead) pool() pool {
	var p pool
	for _, w := range s.eps {
		for range w.n {
			p.buckets = append(p.buckets, w.ep)
		}
	}
	return p
}
