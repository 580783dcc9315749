package main

import (
	"math"
	"math/bits"

	"github.com/weirproxy/weir/plugins/internal/trafficset"
	"github.com/weirproxy/weir/sdk/abi"
)

// approxScale is the total weight, per percent, of an approximate split.
const approxScale = 10000

// tally sums one traffic set's weights per group and then holds the factors
// that turn old weights into new ones.
type tally struct {
	sum, gcd, max [maxGroups + 1]uint64
	// share is each group's percentage after empty groups gave theirs away.
	share [maxGroups + 1]uint64
	// mult and div make a new weight w*mult[g]/div; approx when they would
	// not fit in 32 bits and the weights are scaled and rounded instead.
	mult   [maxGroups + 1]uint64
	div    uint64
	approx bool
}

// apply re-weights s's endpoints according to sp, set by set.
func apply(s abi.Service, sp *split) {
	var t [trafficset.Count]tally
	var used [trafficset.Count]bool
	for i := range s.Len() {
		e := s.Endpoint(i)
		if k := trafficset.Of(e); k >= 0 {
			t[k].add(sp.groupOf(e.Pod()), uint64(e.Weight()))
		}
	}
	for k := range t {
		used[k] = t[k].solve(sp)
	}
	for i := range s.Len() {
		e := s.Endpoint(i)
		if k := trafficset.Of(e); k >= 0 && used[k] {
			e.SetWeight(t[k].weight(sp.groupOf(e.Pod()), uint64(e.Weight())))
		}
	}
}

// add counts an endpoint of weight w in group g.
func (t *tally) add(g int, w uint64) {
	t.sum[g] += w
	t.gcd[g] = gcd(t.gcd[g], w)
	t.max[g] = max(t.max[g], w)
}

// solve works out the set's shares and factors; it reports false when the
// set is to be left alone (it is empty, or every group with endpoints gets 0%).
func (t *tally) solve(sp *split) bool {
	n := sp.n
	t.share = sp.percent
	for g := range n {
		if t.sum[g] == 0 {
			t.share[n] += t.share[g]
			t.share[g] = 0
		}
	}
	if t.sum[n] == 0 {
		t.share[n] = 0
	}
	var total uint64
	for _, p := range t.share {
		total += p
	}
	if total == 0 {
		return false
	}
	t.approx = !t.exact()
	return true
}

// exact computes mult and div so that each group's weights add up to exactly
// its share, keeping the ratios of the weights within a group, with the
// smallest integers that do so; it reports false when they overflow.
func (t *tally) exact() bool {
	// Group g's weights scale by share/sum = num/den; den's lcm makes them whole.
	var num, den [maxGroups + 1]uint64
	c := uint64(1)
	for g := range t.sum {
		if t.sum[g] == 0 || t.share[g] == 0 {
			continue
		}
		d := gcd(t.share[g], t.sum[g])
		num[g], den[g] = t.share[g]/d, t.sum[g]/d
		var ok bool
		if c, ok = mul(c/gcd(c, den[g]), den[g]); !ok {
			return false
		}
	}
	t.div = 0
	for g := range t.sum {
		t.mult[g] = 0
		if den[g] == 0 {
			continue
		}
		m, ok := mul(num[g], c/den[g])
		x, ok2 := mul(m, t.gcd[g])
		if !ok || !ok2 {
			return false
		}
		t.mult[g], t.div = m, gcd(t.div, x)
	}
	for g := range t.sum {
		if x, ok := mul(t.max[g], t.mult[g]); !ok || x/t.div > math.MaxUint32 {
			return false
		}
	}
	return true
}

// weight returns the new weight of an endpoint of weight w in group g.
func (t *tally) weight(g int, w uint64) uint32 {
	if !t.approx {
		return uint32(w * t.mult[g] / t.div)
	}
	if t.share[g] == 0 {
		return 0
	}
	return uint32(max(1, (w*t.share[g]*approxScale+t.sum[g]/2)/t.sum[g]))
}

// mul multiplies, reporting false on overflow.
func mul(a, b uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	return lo, hi == 0
}

// gcd returns the greatest common divisor of a and b (gcd(0, b) = b).
func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
