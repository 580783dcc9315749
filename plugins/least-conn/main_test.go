package main

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

var node = plan.Node{Name: "node-a", Zone: "zone-a"}

// ep returns a cluster endpoint on port 8080 of another node.
func ep(addr string) plan.Endpoint {
	return sdktest.Endpoint(addr, 8080, "node-b", "zone-a", "web-"+addr)
}

func weighted(e plan.Endpoint, w uint32) plan.Endpoint {
	e.Weight = w
	return e
}

// localOnly marks an endpoint as this node's serving terminating one: for
// local traffic only.
func localOnly(e plan.Endpoint) plan.Endpoint {
	e.NodeName, e.Ready, e.Terminating, e.ForCluster, e.ForLocal = node.Name, false, true, false, true
	return e
}

// notServing marks an endpoint as carrying no traffic.
func notServing(e plan.Endpoint) plan.Endpoint {
	e.Ready, e.Serving, e.ForCluster = false, false, false
	return e
}

func service(eps ...plan.Endpoint) *plan.Service {
	return sdktest.Service("default", "web", "10.96.0.10", 80, eps...)
}

func weights(s *plan.Service) []uint32 {
	var w []uint32
	for _, e := range s.Endpoints {
		w = append(w, e.Weight)
	}
	return w
}

// active returns signals with these active counts for the endpoints of s,
// in order; New is left 0.
func active(s *plan.Service, counts ...uint32) map[netip.AddrPort]abi.Signals {
	m := map[netip.AddrPort]abi.Signals{}
	for i, n := range counts {
		m[s.Endpoints[i].AddrPort()] = abi.Signals{Active: n}
	}
	return m
}

func TestReweight(t *testing.T) {
	a, b, c, d := ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3"), ep("10.0.0.4")
	v6a, v6b := ep("fd00::1"), ep("fd00::2")
	tests := []reweightCase{
		// 100 × 1/11 = 9.09.
		{"held connections move weight away", "", service(a, b, c), []uint32{10, 0, 0}, []uint32{9, 100, 100}},
		{"inverse to the load", "", service(a, b, c, d), []uint32{0, 1, 3, 99}, []uint32{100, 50, 25, 1}},
		// 2/1, 1/1, 1/4: 100, 50, 12.5 rounds up to 13.
		{"existing weights kept in ratio", "", service(weighted(a, 2), b, c), []uint32{0, 0, 3}, []uint32{100, 50, 13}},
		{"least-loaded is not always the best", "", service(weighted(a, 10), b), []uint32{4, 0}, []uint32{100, 50}},
		{"never below 1", "", service(a, b), []uint32{0, 1000}, []uint32{100, 1}},
		{"maxWeight", `{"maxWeight":4096}`, service(a, b, c), []uint32{0, 1, 2}, []uint32{4096, 2048, 1365}},
		{"maxWeight 2", `{"maxWeight":2}`, service(a, b, c), []uint32{0, 1, 2}, []uint32{2, 1, 1}},
		{"drained stays drained", "", service(a, weighted(b, 0), c), []uint32{5, 0, 0}, []uint32{17, 0, 100}},
		{"drained idle endpoint is not the best", "", service(a, weighted(b, 0), c), []uint32{3, 0, 1}, []uint32{50, 0, 100}},
		{"not serving is left alone", "", service(a, notServing(b), c), []uint32{1, 0, 0}, []uint32{50, 1, 100}},
		{"no connections", "", service(a, b, c), []uint32{0, 0, 0}, nil},
		{"equal loads", "", service(a, weighted(b, 3), c), []uint32{7, 7, 7}, nil},
		{"one endpoint", "", service(a), []uint32{42}, nil},
		{"families apart", "", service(a, v6a, b, v6b), []uint32{3, 1, 0, 0}, []uint32{25, 50, 100, 100}},
		{"equal family unchanged", "", service(a, v6a, b, v6b), []uint32{3, 5, 0, 5}, []uint32{25, 1, 100, 1}},
		// The local-only endpoint is alone in its set.
		{"local-only set apart", "", service(a, b, localOnly(c)), []uint32{1, 0, 9}, []uint32{50, 100, 1}},
		{"minActive ignores small differences", `{"minActive":5}`, service(a, b, c), []uint32{4, 0, 2}, nil},
		{"minActive from the least", `{"minActive":5}`, service(a, b, c), []uint32{14, 10, 12}, nil},
		// Loads 11 (within 5 of 10), 16: 100, 100, 100 × 11/16 = 68.75.
		{"minActive counts larger ones", `{"minActive":5}`, service(a, b, c), []uint32{14, 10, 15}, []uint32{100, 100, 69}},
		{"minActive 1 is every difference", `{"minActive":1}`, service(a, b), []uint32{1, 0}, []uint32{50, 100}},
	}
	runCases(t, tests)
}

// reweightCase is one service run with active connections per endpoint.
type reweightCase struct {
	name   string
	config string
	in     *plan.Service
	active []uint32
	want   []uint32 // nil: unchanged
}

// runCases runs each case and checks the weights it gives, in the
// endpoints' own order, or that the service comes back unchanged.
func runCases(t *testing.T, tests []reweightCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := sdktest.RunSignals(plugin, tt.config, node, active(tt.in, tt.active...), tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == nil {
				if out[0] != tt.in {
					t.Fatalf("service changed: %v", weights(out[0]))
				}
				return
			}
			if got := weights(out[0]); !slices.Equal(got, tt.want) {
				t.Fatalf("weights %v, want %v", got, tt.want)
			}
			for i, e := range out[0].Endpoints {
				if e.Address != tt.in.Endpoints[i].Address {
					t.Fatalf("endpoint %d is %s, want %s: the order changed", i, e.Address, tt.in.Endpoints[i].Address)
				}
			}
		})
	}
}

// TestNoSignals checks that a version 1 batch, or one without signals for
// the endpoints, passes unchanged.
func TestNoSignals(t *testing.T) {
	in := service(ep("10.0.0.1"), weighted(ep("10.0.0.2"), 7), ep("10.0.0.3"))
	out, err := sdktest.Run(plugin, "", node, in)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != in {
		t.Fatalf("version 1: service changed: %v", weights(out[0]))
	}
	out, err = sdktest.RunSignals(plugin, "", node, nil, in)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != in {
		t.Fatalf("version 2 without signals: service changed: %v", weights(out[0]))
	}
}

// TestServices checks that each service of a batch is balanced on its own.
func TestServices(t *testing.T) {
	busy := service(ep("10.0.0.1"), ep("10.0.0.2"))
	idle := service(ep("10.0.1.1"), ep("10.0.1.2"))
	idle.Key.Name = "idle"
	sig := active(busy, 3, 1)
	out, err := sdktest.RunSignals(plugin, "", node, sig, busy, idle)
	if err != nil {
		t.Fatal(err)
	}
	if got := weights(out[0]); !slices.Equal(got, []uint32{50, 100}) {
		t.Errorf("busy: weights %v, want [50 100]", got)
	}
	if out[1] != idle {
		t.Errorf("idle: service changed: %v", weights(out[1]))
	}
}

// TestExtremes checks counts and weights at 2^32 - 1: no overflow, no
// panic, every weight from 1 to maxWeight.
func TestExtremes(t *testing.T) {
	const m = math.MaxUint32
	a, b, c := ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3")
	tests := []reweightCase{
		{"most active", "", service(a, b), []uint32{m, 0}, []uint32{1, 100}},
		{"most active, heaviest", "", service(weighted(a, m), b), []uint32{m, 0}, []uint32{100, 100}},
		{"heaviest idle", "", service(weighted(a, m), b), []uint32{0, m}, []uint32{100, 1}},
		{"all at the top", `{"maxWeight":4096}`, service(weighted(a, m), weighted(b, m), weighted(c, 1)), []uint32{m, m - 1, 5},
			[]uint32{4096, 4096, 683}},
		{"just below the best", `{"maxWeight":4096}`, service(weighted(a, m), weighted(b, m-1)), []uint32{0, 0}, nil},
		{"minActive at the top", `{"minActive":4294967295}`, service(a, b), []uint32{m, 0}, []uint32{1, 100}},
		{"minActive above every difference", `{"minActive":4294967295}`, service(a, b), []uint32{m - 1, 0}, nil},
	}
	runCases(t, tests)
}

// TestProperties runs random services and checks what holds for every
// input: drained endpoints stay at 0, the others get 1 to maxWeight, the
// best weight/load ratio gets maxWeight, a lower ratio never gets more,
// the same input gives the same output, in any endpoint order.
func TestProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(small, large uint32) uint32 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint32 - rng.Uint32N(3)
		case 2:
			return rng.Uint32N(large)
		}
		return rng.Uint32N(small)
	}
	for round := range 2000 {
		maxWeight := []uint32{2, 3, 100, 1000, 4096}[rng.IntN(5)]
		minActive := []uint32{0, 0, 1, 5, 1000}[rng.IntN(5)]
		config := `{"maxWeight":` + itoa(maxWeight) + `,"minActive":` + itoa(minActive) + `}`
		var eps []plan.Endpoint
		sig := map[netip.AddrPort]abi.Signals{}
		for i := range 1 + rng.IntN(12) {
			e := ep("10.0.0." + itoa(uint32(i+1)))
			e.Weight = pick(4, math.MaxUint32)
			sig[e.AddrPort()] = abi.Signals{Active: pick(10, 1<<20), New: rng.Uint32()}
			eps = append(eps, e)
		}
		in := service(eps...)
		out, err := sdktest.RunSignals(plugin, config, node, sig, in)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got := out[0]
		if got == in {
			continue
		}
		// Ratios w/(a+1) as float64 are close enough to order distinct ones.
		ratio := func(e plan.Endpoint) float64 {
			return float64(e.Weight) / (float64(sig[e.AddrPort()].Active) + 1)
		}
		best := 0.0
		for _, e := range in.Endpoints {
			best = max(best, ratio(e))
		}
		sawMax := false
		for i, e := range got.Endpoints {
			old := in.Endpoints[i]
			switch {
			case old.Weight == 0 && e.Weight != 0:
				t.Fatalf("round %d: drained endpoint %d got weight %d", round, i, e.Weight)
			case old.Weight != 0 && (e.Weight < 1 || e.Weight > maxWeight):
				t.Fatalf("round %d: endpoint %d got weight %d, want 1 to %d", round, i, e.Weight, maxWeight)
			}
			sawMax = sawMax || e.Weight == maxWeight
			if minActive > 0 {
				continue
			}
			for j, o := range in.Endpoints {
				if ratio(old) < ratio(o) && e.Weight > got.Endpoints[j].Weight {
					t.Fatalf("round %d: endpoint %d has a lower ratio than %d but weight %d > %d",
						round, i, j, e.Weight, got.Endpoints[j].Weight)
				}
			}
		}
		if !sawMax {
			t.Fatalf("round %d: no endpoint got maxWeight %d: %v", round, maxWeight, weights(got))
		}
		// The same endpoints reversed get the same weights.
		rev := in.Clone()
		slices.Reverse(rev.Endpoints)
		again, err := sdktest.RunSignals(plugin, config, node, sig, rev)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range again[0].Endpoints {
			if w := got.Endpoints[len(got.Endpoints)-1-i].Weight; e.Weight != w {
				t.Fatalf("round %d: reversed, endpoint %s got %d, not %d", round, e.Address, e.Weight, w)
			}
		}
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func TestBadConfig(t *testing.T) {
	in := service(ep("10.0.0.1"))
	for _, tc := range []struct{ config, field string }{
		{`{"maxWeight":0}`, "maxWeight"},
		{`{"maxWeight":1}`, "maxWeight"},
		{`{"maxWeight":4097}`, "maxWeight"},
		{`{"maxWeight":-1}`, "maxWeight"},
		{`{"maxWeight":"100"}`, "maxWeight"},
		{`{"maxWeight":1.5}`, "maxWeight"},
		{`{"minActive":-1}`, "minActive"},
		{`{"minActive":4294967296}`, "minActive"},
		{`{"maxWeights":100}`, "maxWeights"},
		{`{"interval":"2s"}`, "interval"},
		{`[100]`, "config"},
	} {
		_, err := sdktest.RunSignals(plugin, tc.config, node, nil, in)
		if err == nil {
			t.Errorf("config %s accepted", tc.config)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("config %s: error %q does not name %s", tc.config, err, tc.field)
		}
	}
	for _, c := range []string{"", "null", "{}", `{"maxWeight":2}`, `{"maxWeight":4096,"minActive":0}`, `{"minActive":4294967295}`} {
		if _, err := sdktest.RunSignals(plugin, c, node, nil, in); err != nil {
			t.Errorf("config %q: %v", c, err)
		}
	}
}

// TestExampleConfig checks that the config of config.yaml's entry is accepted.
func TestExampleConfig(t *testing.T) { examples.ExampleConfig(t, plugin, node) }
