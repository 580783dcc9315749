package hooks

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// edit is what a test plays plugin for: it edits one service of a batch
// through the SDK's views, as a guest would.
type edit func(s abi.Service, r *rand.Rand)

var edits = map[string]edit{
	"none":     func(abi.Service, *rand.Rand) {},
	"reweight": func(s abi.Service, r *rand.Rand) { reweightAll(s, r) },
	"affinity": func(s abi.Service, r *rand.Rand) {
		s.SetAffinity(uint32(r.IntN(abi.MaxAffinitySeconds + 1)))
		_ = s.SetScheduler(plan.Schedulers[r.IntN(len(plan.Schedulers))])
	},
	"drop":     func(s abi.Service, r *rand.Rand) { s.Keep(func(abi.Endpoint) bool { return r.IntN(3) > 0 }) },
	"drop-all": func(s abi.Service, r *rand.Rand) { s.Keep(func(abi.Endpoint) bool { return false }) },
	"reorder": func(s abi.Service, r *rand.Rand) {
		for i := s.Len() - 1; i > 0; i-- {
			s.Swap(i, r.IntN(i+1))
		}
		reweightAll(s, r)
	},
	"everything": func(s abi.Service, r *rand.Rand) {
		s.Keep(func(abi.Endpoint) bool { return r.IntN(4) > 0 })
		for i := s.Len() - 1; i > 0; i-- {
			s.Swap(i, r.IntN(i+1))
		}
		reweightAll(s, r)
		s.SetAffinity(uint32(r.IntN(100)))
	},
}

func reweightAll(s abi.Service, r *rand.Rand) {
	for j := range s.Len() {
		s.Endpoint(j).SetWeight(uint32(r.IntN(5)))
	}
}

// relayServices returns n services with every kind of field the layout
// has: both families, external and load-balancer IPs, source ranges,
// labels, annotations, and endpoints with nodes, zones and pods.
func relayServices(r *rand.Rand, n int) []*plan.Service {
	out := make([]*plan.Service, n)
	for i := range out {
		s := sdktest.Service(fmt.Sprintf("ns-%d", i%3), fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.0.%d", i%250), 80)
		if i%4 == 1 {
			s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00::%x", i)))
			s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
			s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8::1")}
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
			s.Labels = map[string]string{"app": "web", "tier": fmt.Sprint(i)}
			s.Annotations = map[string]string{"note": fmt.Sprint("n", i)}
		}
		for j := range r.IntN(12) {
			addr := fmt.Sprintf("10.244.%d.%d", i%250, j+1)
			if i%4 == 1 && j%2 == 1 {
				addr = fmt.Sprintf("fd00:244::%x:%x", i, j)
			}
			s.Endpoints = append(s.Endpoints, sdktest.Endpoint(addr, 8080, fmt.Sprintf("node-%d", j%3),
				fmt.Sprintf("zone-%d", j%2), fmt.Sprintf("pod-%d-%d", i, j)))
		}
		out[i] = s
	}
	return out
}

// playPlugin runs edits on a copy of batch, as a plugin's output, and
// then scribbles over what Weir does not read back: every endpoint's node
// name now points at the service's name, the node's at the namespace.
func playPlugin(t *testing.T, batch []byte, r *rand.Rand, names []string) []byte {
	t.Helper()
	out := bytes.Clone(batch)
	b, err := abi.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b.Len() {
		edits[names[i%len(names)]](b.Service(i), r)
	}
	copy(out[batchNode:batchNode+strSize], out[recOffset(out, 0)+recKey:])
	for i := range b.Len() {
		rec := recOffset(out, i)
		eoff := rec + int(le.Uint32(out[rec+recEndpointsOff:]))
		for j := range b.Service(i).Len() {
			copy(out[eoff+abi.EndpointSize*j+epStrs:], out[rec+recKey+strSize:rec+recKey+2*strSize])
		}
	}
	return out
}

func recOffset(b []byte, i int) int { return int(le.Uint32(b[abi.HeaderSize+4*i:])) }

// checkRelay relays output (a plugin's, for the batch sent holding in) and
// checks the result against encoding the plugin's outputs afresh; it
// returns both.
func checkRelay(t *testing.T, node plan.Node, sent, output []byte, in []*plan.Service) (relayed, encoded []byte) {
	t.Helper()
	outs, err := abi.Decode(in, output)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	relayed = relay(make([]byte, len(sent)), sent, output, in, outs)
	inPlace := relay(bytes.Clone(sent), bytes.Clone(sent), output, in, outs)
	if !bytes.Equal(relayed, inPlace) {
		t.Fatal("relaying in place gives other bytes than relaying to a new buffer")
	}
	again, err := abi.Decode(outs, relayed)
	if err != nil {
		t.Fatalf("the relayed batch does not hold the outputs: %v", err)
	}
	for i := range outs {
		if again[i] != outs[i] {
			t.Fatalf("service %d: the relayed batch holds %v, the output was %v", i, again[i], outs[i])
		}
	}
	if _, err := abi.Parse(relayed); err != nil {
		t.Fatalf("a guest cannot parse the relayed batch: %v", err)
	}
	full := le.Uint16(sent[batchFlags:])&abi.FlagFull != 0
	var enc abi.Encoder
	encoded = enc.Encode(node, outs, full)
	n1, s1, f1, err1 := abi.DecodeBatch(relayed)
	n2, s2, f2, err2 := abi.DecodeBatch(encoded)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(n1, n2) || f1 != f2 || !reflect.DeepEqual(s1, s2) {
		t.Fatalf("the relayed batch holds %v %v %v (%v), encoding the outputs gives %v %v %v (%v)",
			n1, s1, f1, err1, n2, s2, f2, err2)
	}
	return relayed, encoded
}

// TestRelay shows that a relayed batch holds what encoding a plugin's
// outputs afresh holds, for every change a plugin may make; that it is the
// same bytes unless the plugin dropped or moved endpoints (then the string
// area differs); and that none of what the plugin wrote beyond the fields
// Weir checks reaches the next plugin.
func TestRelay(t *testing.T) {
	node := plan.Node{Name: "node-a", Zone: "zone-a"}
	for _, tc := range []struct {
		edits []string
		same  bool // the relayed batch is byte for byte the encoded one
	}{
		{[]string{"none"}, true},
		{[]string{"reweight"}, true},
		{[]string{"affinity"}, true},
		{[]string{"reweight", "affinity", "none"}, true},
		{[]string{"drop"}, false},
		{[]string{"drop-all"}, false},
		{[]string{"reorder"}, false},
		{[]string{"everything"}, false},
		{[]string{"none", "drop", "reorder", "everything", "drop-all", "affinity"}, false},
	} {
		t.Run(fmt.Sprint(tc.edits), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(tc.edits))))
			in := relayServices(r, 40)
			var enc abi.Encoder
			sent := bytes.Clone(enc.Encode(node, in, true))
			relayed, encoded := checkRelay(t, node, sent, playPlugin(t, sent, r, tc.edits), in)
			if tc.same && !bytes.Equal(relayed, encoded) {
				t.Error("the relayed batch is not byte for byte the encoded one")
			}
		})
	}
}

// TestRelayRandom relays random plugin outputs, each relayed batch
// playing the next plugin's input, as in a chain.
func TestRelayRandom(t *testing.T) {
	node := plan.Node{Name: "node-b"}
	names := slices.Sorted(maps.Keys(edits))
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		in := relayServices(r, 1+r.IntN(30))
		var enc abi.Encoder
		sent := bytes.Clone(enc.Encode(node, in, r.IntN(2) == 0))
		for range 3 {
			order := slices.Clone(names)
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			output := playPlugin(t, sent, r, order)
			outs, err := abi.Decode(in, output)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			relayed, _ := checkRelay(t, node, sent, output, in)
			sent, in = relayed, outs
		}
	}
}

// TestChainRelay shows that relaying outputs from plugin to plugin gives a
// chain the results encoding every batch afresh gives, on a full sync of
// several calls and on a partial one, and that only the first plugin's
// batches are encoded.
func TestChainRelay(t *testing.T) {
	cfgs := []Config{
		{Name: "drain", Path: guest("drain"), Config: map[string]any{"nodes": []any{"node-2"}}},
		{Name: "affinity", Path: guest("affinity")},
		reweight("reweight", "w"),
		{Name: "zone-preference", Path: guest("zone-preference"), Config: map[string]any{"minEndpoints": 1}},
	}
	node := plan.Node{Name: "node-0", Zone: "zone-0"}
	services := relayServices(rand.New(rand.NewPCG(3, 4)), 3000)
	for i := 0; i < len(services); i += 3 {
		services[i] = with(services[i], "w", fmt.Sprint(2+i%5))
		services[i+1] = with(services[i+1], "affinity.weir.dev/client-ip", fmt.Sprint(i%7+1, "m"))
	}
	changed := []*plan.Service{with(services[0], "w", "9"), with(services[1], "w", "8")}
	relayed, _ := newChain(t, Options{}, cfgs...)
	encoded, _ := newChain(t, Options{}, cfgs...)
	encoded.noRelay = true
	for _, step := range []struct {
		services []*plan.Service
		full     bool
	}{{services, true}, {changed, false}} {
		want, err := encoded.Apply(t.Context(), node, step.services, step.full)
		if err != nil {
			t.Fatal(err)
		}
		got, err := relayed.Apply(t.Context(), node, step.services, step.full)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if !got[i].Equal(want[i]) {
				t.Fatalf("full=%v, service %d: relayed %v, encoded %v", step.full, i, got[i], want[i])
			}
		}
	}
	drain, _ := stats(relayed, "drain")
	var all int64
	for _, cfg := range cfgs {
		calls, _ := stats(encoded, cfg.Name)
		all += calls
	}
	if drain < 5 || relayed.encoded.Load() != drain || encoded.encoded.Load() != all {
		t.Errorf("relaying encoded %d batches for drain's %d calls; without, %d for %d calls",
			relayed.encoded.Load(), drain, encoded.encoded.Load(), all)
	}
}

// TestChainRelayChecked shows that what a plugin writes beyond the fields
// Weir checks never reaches the next plugin: the next one sees the node's
// and the endpoints' own names.
func TestChainRelayChecked(t *testing.T) {
	c, logs := newChain(t, Options{},
		Config{Name: "scribble", Path: guest("hostile"), Config: map[string]any{"mode": "scribble"}},
		Config{Name: "tell", Path: guest("hostile"), Config: map[string]any{"mode": "tell"}})
	if _, err := apply(c, bigServices(3, 2), true); err != nil {
		t.Fatal(err)
	}
	told := logs.lines("plugin=tell", "line=")
	if len(told) != 1 || !strings.Contains(told[0], `"node=node-a first=node-a"`) || c.encoded.Load() != 1 {
		t.Errorf("the second plugin saw %q after %d encoded batches, want node-a twice after 1", told, c.encoded.Load())
	}
}

// TestChainRelayCurrent shows that a plugin gets a relayed batch only when
// it holds the services as they are now: here the plugin before it took a
// service's output from its cache, not the one relayed past it.
func TestChainRelayCurrent(t *testing.T) {
	cfgs := []Config{
		{Name: "drain", Path: guest("drain"), Config: map[string]any{"nodes": []any{"node-2"}}},
		reweight("reweight", "w"),
		{Name: "noop", Path: guest("noop")},
	}
	x := svc("default", "x", 3, "w", "5")
	for j := range x.Endpoints {
		x.Endpoints[j].NodeName = fmt.Sprint("node-", j)
	}
	moved := x.Clone() // drain drops the endpoint that moved: its output stays the same
	moved.Endpoints[2].Port++
	var outs [2][]*plan.Service
	for k, relaying := range []bool{true, false} {
		c, _ := newChain(t, Options{}, cfgs...)
		c.noRelay = !relaying
		if _, err := apply(c, []*plan.Service{x}, true); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		c.flush(2) // as a reload of noop would
		c.mu.Unlock()
		out, err := apply(c, []*plan.Service{moved}, true)
		if err != nil {
			t.Fatal(err)
		}
		outs[k] = out
	}
	if !outs[0][0].Equal(outs[1][0]) || !slices.Equal(weights(outs[0][0]), []uint32{5, 5}) {
		t.Errorf("relaying gives %v, encoding %v; want the weights 5 of reweight", outs[0][0], outs[1][0])
	}
}

// TestChainRelayFull shows that a relayed batch carries the Full flag of
// the call it goes to, not of the one it came from.
func TestChainRelayFull(t *testing.T) {
	c, logs := newChain(t, Options{},
		Config{Name: "mine", Path: guest("noop"), Match: Match{Namespaces: []string{"mine"}}},
		Config{Name: "report", Path: guest("hostile"), Config: map[string]any{"mode": "report"}})
	other := svc("theirs", "other", 1)
	for _, services := range [][]*plan.Service{{other}, {svc("mine", "new", 1), other}} {
		if _, err := apply(c, services, true); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, l := range logs.lines("plugin=report", "line=") {
		_, text, _ := strings.Cut(l, "line=")
		got = append(got, strings.Trim(text, `"`))
	}
	want := []string{"batch services=1 full=true", "batch services=1 full=false"}
	if !slices.Equal(got, want) || c.encoded.Load() != 2 {
		t.Errorf("reports %q after %d encoded batches, want %q after 2", got, c.encoded.Load(), want)
	}
}
