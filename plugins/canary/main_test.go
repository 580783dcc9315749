package main

import (
	"bytes"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

var node = plan.Node{Name: "node-1", Zone: "zone-a"}

// service returns default/web with one endpoint per pod name, all of weight 1.
func service(split string, pods ...string) *plan.Service {
	var eps []plan.Endpoint
	for i, pod := range pods {
		eps = append(eps, sdktest.Endpoint("10.0.1."+strconv.Itoa(i+1), 8080, "node-"+strconv.Itoa(i%3+1), "zone-a", pod))
	}
	s := sdktest.Service("default", "web", "10.96.0.10", 80, eps...)
	if split != "" {
		s.Annotations = map[string]string{defaultAnnotation: split}
	}
	return s
}

// withWeights sets the endpoints' weights in order.
func withWeights(s *plan.Service, w ...uint32) *plan.Service {
	for i := range w {
		s.Endpoints[i].Weight = w[i]
	}
	return s
}

func weights(s *plan.Service) []uint32 {
	var w []uint32
	for _, e := range s.Endpoints {
		w = append(w, e.Weight)
	}
	return w
}

// captureLog sends the plugin's log lines to a buffer for the test.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := logOut
	logOut = &buf
	t.Cleanup(func() { logOut = old })
	return &buf
}

func run(t *testing.T, config string, in *plan.Service) *plan.Service {
	t.Helper()
	out, err := sdktest.Run(plugin, config, node, in)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out[0]
}

func TestSplit(t *testing.T) {
	tests := []struct {
		name string
		in   *plan.Service
		want []uint32 // nil: the service must come back unchanged
	}{
		{"no annotation", service("", "web-canary-1", "web-1"), nil},
		{"empty annotation", service(" ", "web-canary-1", "web-1"), nil},
		{"already exact", service("web-canary=10", "web-canary-1", "web-1", "web-2", "web-3", "web-4", "web-5", "web-6", "web-7", "web-8", "web-9"), nil},
		{"three of ten at 10%", service("web-canary=10", "web-canary-1", "web-canary-2", "web-canary-3", "web-1", "web-2", "web-3", "web-4", "web-5", "web-6", "web-7"),
			[]uint32{7, 7, 7, 27, 27, 27, 27, 27, 27, 27}},
		{"half", service("web-canary=50", "web-1", "web-canary-1", "web-2"), []uint32{1, 2, 1}},
		{"percent sign and spaces", service(" web-canary = 50% ", "web-1", "web-canary-1", "web-2"), []uint32{1, 2, 1}},
		{"two groups", service("a=10,b=5", "a-1", "b-1", "c-1", "c-2"), []uint32{4, 2, 17, 17}},
		{"longest prefix wins", service("web=20,web-canary=10", "web-canary-1", "web-1", "other-1"), []uint32{1, 2, 7}},
		{"zero percent drains the group", service("web-canary=0", "web-canary-1", "web-1"), []uint32{0, 1}},
		{"hundred percent drains the rest", service("web-canary=100", "web-canary-1", "web-1"), []uint32{1, 0}},
		{"empty group gives its share to the rest", service("a=10,b=30", "a-1", "c-1"), []uint32{1, 9}},
		{"no canary endpoints", service("web-canary=10", "web-1", "web-2"), nil},
		{"only canary endpoints", service("web-canary=10", "web-canary-1", "web-canary-2"), nil},
		{"only canary endpoints, two groups", service("a=10,b=30", "a-1", "b-1"), []uint32{1, 3}},
		{"zero percent but nothing else", service("web-canary=0", "web-canary-1"), nil},
		{"pods without names are the rest", service("web-canary=25", "web-canary-1", ""), []uint32{1, 3}},
		{"existing weights keep their ratio", withWeights(service("c=20", "c-1", "c-2", "s-1", "s-2"), 1, 3, 2, 2), []uint32{1, 3, 8, 8}},
		{"drained endpoints stay drained", withWeights(service("c=50", "c-1", "c-2", "s-1"), 0, 1, 1), []uint32{0, 1, 1}},
		{"drained endpoints do not count", withWeights(service("c=50", "c-1", "c-2", "s-1", "s-2"), 0, 1, 1, 1), []uint32{0, 2, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := captureLog(t)
			out := run(t, "", tt.in)
			if log.Len() > 0 {
				t.Errorf("unexpected log: %s", log)
			}
			if tt.want == nil {
				if out != tt.in {
					t.Fatalf("service changed, weights %v", weights(out))
				}
				return
			}
			if got := weights(out); !slices.Equal(got, tt.want) {
				t.Fatalf("weights %v, want %v", got, tt.want)
			}
		})
	}
}

func TestIdleEndpointsUntouched(t *testing.T) {
	in := service("c=50", "c-1", "c-2", "s-1")
	in.Endpoints[1].ForCluster = false // carries no traffic
	in.Endpoints[1].Ready = false
	out := run(t, "", in)
	if got, want := weights(out), []uint32{1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("weights %v, want %v", got, want)
	}
	in.Endpoints = append(in.Endpoints, sdktest.Endpoint("10.0.1.9", 8080, "node-1", "zone-a", "s-2"))
	out = run(t, "", in)
	if got, want := weights(out), []uint32{2, 1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("weights %v, want %v", got, want)
	}
}

// TestSetsSplitSeparately checks that IPv4, IPv6 and local-only endpoints
// are each split exactly among themselves.
func TestSetsSplitSeparately(t *testing.T) {
	in := service("c=25", "c-1", "s-1", "s-2", "s-3", "c-2", "s-4")
	in.Endpoints[4].Address = netip.MustParseAddr("fd00::5")
	in.Endpoints[5].Address = netip.MustParseAddr("fd00::6")
	in.Endpoints = append(in.Endpoints,
		localOnly(sdktest.Endpoint("10.0.1.7", 8080, "node-1", "zone-a", "c-3")),
		localOnly(sdktest.Endpoint("10.0.1.8", 8080, "node-1", "zone-a", "s-5")))
	out := run(t, "", in)
	// IPv4 cluster: c-1 vs s-1..3 → 1:1 already; IPv6: c-2 25%, s-4 75% → 1:3;
	// IPv4 local only: c-3 1, s-5 3.
	if got, want := weights(out), []uint32{1, 1, 1, 1, 1, 3, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("weights %v, want %v", got, want)
	}
}

func localOnly(e plan.Endpoint) plan.Endpoint {
	e.Ready, e.Terminating, e.ForCluster, e.ForLocal, e.Local = false, true, false, true, true
	return e
}

// TestExactShares checks over many endpoint counts, weights and splits that
// each group gets exactly its percentage.
func TestExactShares(t *testing.T) {
	splits := []string{"a=1", "a=10", "a=33,b=33", "a=7,b=11,c=13", "a=99", "a=50,b=50"}
	for _, sp := range splits {
		for n := 1; n <= 7; n++ {
			var pods []string
			var w []uint32
			for i := range 3 * n {
				pods = append(pods, string(rune('a'+i%4))+"-"+strconv.Itoa(i))
				w = append(w, uint32(1+i*i%5))
			}
			in := withWeights(service(sp, pods...), w...)
			out := run(t, "", in)
			checkShares(t, sp, in, out)
		}
	}
}

// checkShares verifies the group shares of out and that weights within a
// group kept their ratios.
func checkShares(t *testing.T, spec string, in, out *plan.Service) {
	t.Helper()
	sp, err := parseSplit(spec)
	if err != nil {
		t.Fatal(err)
	}
	var sum [maxGroups + 1]uint64
	var total uint64
	for _, e := range out.Endpoints {
		sum[sp.groupOf(e.Pod)] += uint64(e.Weight)
		total += uint64(e.Weight)
	}
	var tl tally
	for _, e := range in.Endpoints {
		tl.add(sp.groupOf(e.Pod), uint64(e.Weight))
	}
	if !tl.solve(&sp) {
		t.Fatalf("%s: set unexpectedly left alone", spec)
	}
	var shares uint64 // 100, or less when the rest has no endpoints
	for _, p := range tl.share {
		shares += p
	}
	for g := range sp.n + 1 {
		if sum[g]*shares != tl.share[g]*total {
			t.Errorf("%s %v -> %v: group %d has %d/%d, want %d/%d", spec, weights(in), weights(out), g, sum[g], total, tl.share[g], shares)
		}
	}
	for i, e := range out.Endpoints {
		for j, f := range out.Endpoints {
			g := sp.groupOf(e.Pod)
			if g == sp.groupOf(f.Pod) && uint64(e.Weight)*uint64(in.Endpoints[j].Weight) != uint64(f.Weight)*uint64(in.Endpoints[i].Weight) {
				t.Errorf("%s: endpoints %d and %d lost their ratio", spec, i, j)
			}
		}
	}
}

// TestHugeWeightsApproximate checks the rounded split used when exact
// weights would not fit in 32 bits.
func TestHugeWeightsApproximate(t *testing.T) {
	in := withWeights(service("c=10", "c-1", "c-2", "s-1", "s-2"), 4294967291, 4294967279, 4294967231, 4294967197)
	out := run(t, "", in)
	var c, total float64
	for _, e := range out.Endpoints {
		if e.Weight == 0 || e.Weight > 1_000_001 {
			t.Fatalf("weight %d out of the approximate range", e.Weight)
		}
		total += float64(e.Weight)
		if strings.HasPrefix(e.Pod, "c-") {
			c += float64(e.Weight)
		}
	}
	if share := c / total; math.Abs(share-0.10) > 1e-5 {
		t.Fatalf("canary share %v, want 0.10", share)
	}
}

func TestBadAnnotation(t *testing.T) {
	for _, v := range []string{
		"web-canary", "=10", "a=", "a=101", "a=-1", "a=1.5", "a=ten", "a=60,b=50", "a=1,a=2", "a=10,",
		"a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1",
	} {
		t.Run(v, func(t *testing.T) {
			log := captureLog(t)
			in := service(v, "a-1", "b-1", "c-1")
			out := run(t, "", in)
			if out != in {
				t.Fatalf("service changed: %v", weights(out))
			}
			line := log.String()
			if !strings.HasPrefix(line, in.Key.String()+": annotation "+defaultAnnotation+"=") || strings.Count(line, "\n") != 1 {
				t.Fatalf("log %q does not name the service and annotation in one line", line)
			}
		})
	}
}

func TestBatchIsolatesBadServices(t *testing.T) {
	captureLog(t)
	good, bad, plain := service("c=50", "c-1", "s-1", "s-2"), service("c=500", "c-1", "s-1"), service("", "c-1")
	bad.Key.Name, plain.Key.Name = "bad", "plain"
	out, err := sdktest.Run(plugin, "", node, good, bad, plain)
	if err != nil {
		t.Fatal(err)
	}
	if got := weights(out[0]); !slices.Equal(got, []uint32{2, 1, 1}) {
		t.Errorf("good service weights %v", got)
	}
	if out[1] != bad || out[2] != plain {
		t.Errorf("bad or plain service changed")
	}
}

func TestConfig(t *testing.T) {
	in := service("", "c-1", "s-1", "s-2")
	in.Annotations = map[string]string{"example.com/split": "c=50"}
	out := run(t, `{"annotation":"example.com/split"}`, in)
	if got := weights(out); !slices.Equal(got, []uint32{2, 1, 1}) {
		t.Fatalf("weights %v with the annotation overridden", got)
	}
	if out := run(t, "", in); out != in {
		t.Fatalf("default annotation key read example.com/split")
	}
	for _, bad := range []string{`{"annotation":""}`, `{"annotation":" "}`, `{"annotation":5}`, `{"anotation":"x"}`, `[]`, `{`} {
		if _, err := sdktest.Run(plugin, bad, node, in); err == nil {
			t.Errorf("config %s accepted", bad)
		}
	}
}

// TestExampleConfig checks that the config of config.yaml's entry is accepted.
func TestExampleConfig(t *testing.T) { examples.ExampleConfig(t, plugin, node) }
