// Command least-conn is a Weir hook plugin that weights each endpoint
// inversely to the connections open to it through this node, so that new
// connections go mostly to the least-loaded endpoints. It needs Weir's live
// signals (signals: [connections]); without them it changes nothing. See
// README.md.
package main

import (
	"errors"
	"math/bits"
	"strconv"

	"github.com/weirproxy/weir/plugins/internal/trafficset"
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

// Bounds and default of maxWeight. The nftables backend spreads a pool over
// at most 4096 buckets, so a larger weight could not be expressed there even
// for one endpoint; the default keeps a ten-endpoint service within 1000
// buckets (and within the 1000 that iptables' read-back recovers exactly).
const (
	minMaxWeight     = 2
	maxMaxWeight     = 4096
	defaultMaxWeight = 100
)

// config is the plugin's configuration as Weir hands it over.
type config struct {
	// MaxWeight is the weight the least-loaded endpoint of a traffic set gets.
	MaxWeight uint32 `json:"maxWeight"`
	// MinActive is the smallest difference in active connections, from the
	// least-loaded endpoint of the set, that counts; smaller ones are ignored.
	MinActive uint32 `json:"minActive"`
}

var (
	current = config{MaxWeight: defaultMaxWeight}
	// plugin is what init registers; tests run it through sdktest.
	plugin = guest.Plugin{Configure: configure, Process: process}
)

func init() { guest.Register(plugin) }

func main() {}

// configure parses and checks the configuration; with none the defaults apply.
func configure(raw []byte) error {
	c := config{MaxWeight: defaultMaxWeight}
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if c.MaxWeight < minMaxWeight || c.MaxWeight > maxMaxWeight {
		return errors.New("maxWeight: must be between " + strconv.Itoa(minMaxWeight) + " and " +
			strconv.Itoa(maxMaxWeight) + ", got " + strconv.FormatUint(uint64(c.MaxWeight), 10))
	}
	current = c
	return nil
}

// process re-weights every service of a batch that carries signals; a
// version 1 batch has none, and passes unchanged.
func process(b *abi.Batch) error {
	if b.Version() < abi.Version2 {
		return nil
	}
	for i := range b.Len() {
		reweight(b.Service(i), current)
	}
	return nil
}

// tally is what reweight learns of one traffic set.
type tally struct {
	// least is the smallest active count in the set, once seen is true.
	least uint32
	seen  bool
	// first is the load of the set's first endpoint; differ is whether
	// another endpoint's load is not first.
	first  uint64
	differ bool
	// weight and load are those of the endpoint with the largest
	// weight/load, the one that gets maxWeight.
	weight, load uint64
}

// sets holds, by slot, the traffic set of each endpoint of the service
// being re-weighted; reused from service to service.
var sets []int8

// reweight sets, in each traffic set of s whose endpoints' loads differ,
// each endpoint's weight to maxWeight × (w/load) / (w/load of the set's
// best endpoint), rounded, at least 1, where w is its weight and load is
// 1 + its active connections (counted as the set's least when within
// minActive of it). A set whose loads are all equal keeps its weights.
func reweight(s abi.Service, c config) {
	var t [trafficset.Count]tally
	n := s.Len()
	if cap(sets) < n {
		sets = make([]int8, n)
	}
	sets = sets[:n]
	for i := range n {
		e := s.Endpoint(i)
		k := trafficset.Of(e)
		sets[i] = int8(k)
		if k >= 0 {
			a := e.Active()
			if !t[k].seen || a < t[k].least {
				t[k].least, t[k].seen = a, true
			}
		}
	}
	for i, k := range sets {
		if k < 0 {
			continue
		}
		e := s.Endpoint(i)
		w, l := uint64(e.Weight()), load(e.Active(), t[k].least, c.MinActive)
		switch {
		case t[k].weight == 0:
			t[k].first, t[k].weight, t[k].load = l, w, l
			continue
		case l != t[k].first:
			t[k].differ = true
		}
		// w/l > best.weight/best.load, exactly: each product is below 2^64.
		if w*t[k].load > t[k].weight*l {
			t[k].weight, t[k].load = w, l
		}
	}
	if !t[0].differ && !t[1].differ && !t[2].differ && !t[3].differ {
		return
	}
	for i, k := range sets {
		if k >= 0 && t[k].differ {
			e := s.Endpoint(i)
			w, l := uint64(e.Weight()), load(e.Active(), t[k].least, c.MinActive)
			e.SetWeight(scale(w, l, t[k].weight, t[k].load, c.MaxWeight))
		}
	}
}

// load returns 1 + active, or 1 + least when active is less than minActive
// above least.
func load(active, least, minActive uint32) uint64 {
	if active-least < minActive {
		active = least
	}
	return uint64(active) + 1
}

// scale returns max × (w/l) / (bw/bl), rounded half up, at least 1, for
// w/l ≤ bw/bl; the result is then at most max. w and bw are below 2^32, l
// and bl at most 2^32, so w×bl and l×bw fit in 64 bits and the product
// with max is taken in 128.
func scale(w, l, bw, bl uint64, maxWeight uint32) uint32 {
	num, den := w*bl, l*bw
	hi, lo := bits.Mul64(num, uint64(maxWeight))
	// num ≤ den, so the quotient is at most maxWeight and hi < den.
	q, rem := bits.Div64(hi, lo, den)
	if rem >= den-rem {
		q++
	}
	return uint32(max(q, 1))
}
