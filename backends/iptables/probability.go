package iptables

import "strconv"

// probabilityScale is the precision of --probability: 10 decimals, like
// kube-proxy.
const probabilityScale = 10_000_000_000

// probabilities returns, for endpoints with the given weights (each > 0),
// the --probability of each statistic rule in units of 1e-10; the last
// endpoint's rule matches unconditionally and gets no value, so the result
// has one element fewer than weights.
//
// Rule i sees only what the earlier rules left, so its probability is
// endpoint i's share of the remaining weight. Rounding each to 10 decimals
// would let the errors pile up on the last endpoints; instead each value is
// chosen from what the already rounded earlier rules really leave, so that
// the traffic remaining after rule i is as close as the precision allows to
// the weight of the endpoints after i. Every endpoint's share is then within
// 1e-10 of weight/total.
func probabilities(weights []uint64) []uint64 {
	if len(weights) < 2 {
		return nil
	}
	var total uint64
	for _, w := range weights {
		total += w
	}
	out := make([]uint64, len(weights)-1)
	remaining := total // weight of the endpoints not yet reached
	mass := 1.0        // share of traffic reaching rule i, from the rounded values
	for i := range out {
		remaining -= weights[i]
		var p uint64
		if mass > 0 {
			want := float64(remaining) / float64(total) // share that should pass rule i
			q := 1 - want/mass
			p = uint64(min(max(q*probabilityScale+0.5, 0), probabilityScale))
		}
		out[i] = p
		mass *= 1 - float64(p)/probabilityScale
	}
	return out
}

// appendProbability formats p (units of 1e-10) with 10 decimals.
func appendProbability(b []byte, p uint64) []byte {
	b = strconv.AppendUint(b, p/probabilityScale, 10)
	b = append(b, '.')
	frac := p % probabilityScale
	var digits [10]byte
	for i := 9; i >= 0; i-- {
		digits[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(b, digits[:]...)
}
