package abi

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// fuzzInput is the batch the fuzz targets decode against.
func fuzzInput() []*plan.Service {
	dup := simple("a", "first", 2)
	return []*plan.Service{dup, rich(), simple("b", "third", 3)}
}

// FuzzDecode feeds arbitrary bytes to every decoder: none may panic, and an
// accepted output may only make the changes the ABI allows.
func FuzzDecode(f *testing.F) {
	in := fuzzInput()
	var e Encoder
	f.Add(slices.Clone(e.Encode(testNode, in, true)))
	f.Add(slices.Clone(e.Encode(plan.Node{}, nil, false)))
	f.Add(slices.Clone(e.Encode(testNode, in[:1], false)))
	f.Add([]byte("WEIR"))
	f.Add([]byte{})
	f.Add(make([]byte, 100))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, in, data)
		exerciseViews(data)
	})
}

// FuzzDecodeMutated applies byte edits (4-byte little-endian position, then a
// value) to a valid batch and decodes it.
func FuzzDecodeMutated(f *testing.F) {
	in := fuzzInput()
	var e Encoder
	valid := slices.Clone(e.Encode(testNode, in, true))
	rec1 := int(u32(valid, HeaderSize+4))
	slot := func(i, j int) int { return slotOf(valid, i, j) }
	for _, seed := range [][2]int{
		{hCount, 2}, {HeaderSize, 1}, {rec1 + sEndpoints, 9}, {rec1 + sEndpoints, 2}, {rec1 + sScheduler, 3},
		{rec1 + sAffinity + 2, 9}, {slot(1, 0) + eID, 3}, {slot(1, 1) + eWeight, 5}, {slot(0, 0) + eID, 1},
		{rec1 + sEndpointsOff, 0}, {slot(2, 2) + ePod + 3, 0xff}, {rec1 + sLabels, 1},
	} {
		f.Add(binary.LittleEndian.AppendUint32(nil, uint32(seed[0])), byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, edits []byte, last byte) {
		data := slices.Clone(valid)
		edits = append(edits, last)
		for ; len(edits) >= 5; edits = edits[5:] {
			if p := int(binary.LittleEndian.Uint32(edits)); p < len(data) {
				data[p] = edits[4]
			}
		}
		checkDecode(t, in, data)
		exerciseViews(data)
	})
}

// checkDecode decodes data against in and checks that an accepted output
// changed only what a plugin may.
func checkDecode(t *testing.T, in []*plan.Service, data []byte) {
	out, err := Decode(in, data)
	if err != nil {
		if _, ok := err.(*OutputError); !ok { //nolint:errorlint // Decode returns the *OutputError itself, never wrapped
			t.Fatalf("error %T is not an *OutputError: %v", err, err)
		}
		return
	}
	if len(out) != len(in) {
		t.Fatalf("%d services out, %d in", len(out), len(in))
	}
	for i, s := range out {
		if s == in[i] {
			continue
		}
		a, b := *s, *in[i]
		a.Endpoints, a.Affinity, a.Scheduler = nil, nil, ""
		b.Endpoints, b.Affinity, b.Scheduler = nil, nil, ""
		if !a.Equal(&b) {
			t.Fatalf("service %d: a field a plugin may not change changed", i)
		}
		if s.Affinity != nil && s.Affinity.TimeoutSeconds > MaxAffinitySeconds {
			t.Fatalf("service %d: affinity %d", i, s.Affinity.TimeoutSeconds)
		}
		if !slices.Contains(plan.Schedulers, s.Scheduler) {
			t.Fatalf("service %d: scheduler %q", i, s.Scheduler)
		}
		seen := map[int]bool{}
		for _, ep := range s.Endpoints {
			j := slices.IndexFunc(in[i].Endpoints, func(o plan.Endpoint) bool { ep.Weight = o.Weight; return ep == o })
			if j < 0 || seen[j] {
				t.Fatalf("service %d: endpoint %v was not sent or is repeated", i, ep)
			}
			seen[j] = true
		}
	}
}

// exerciseViews runs every accessor of a batch Parse accepts.
func exerciseViews(data []byte) {
	if _, _, _, err := DecodeBatch(data); err != nil {
		return
	}
	b, err := Parse(data)
	if err != nil {
		panic("DecodeBatch accepted what Parse rejects: " + err.Error())
	}
	for i := range b.Len() {
		s := b.Service(i)
		s.Label("app")
		s.Annotation("a")
		s.SortEndpoints(func(a, b Endpoint) bool { return a.Weight() < b.Weight() })
		s.Keep(func(e Endpoint) bool { e.SetWeight(e.Weight() + 1); return e.ID()%2 == 0 })
		if s.Len() > 1 {
			s.Swap(0, s.Len()-1)
		}
		s.SetAffinity(s.AffinitySeconds())
		_ = s.SetScheduler(s.Scheduler())
	}
}

// FuzzDecodeBatch feeds arbitrary bytes to DecodeBatch, the host-side
// reader of a whole batch. It never panics; what it accepts encodes again
// into a batch that decodes to the same node, full flag and services, but
// for what Encode documents it changes (an affinity above the maximum is
// clamped; a source range with an impossible length, which no plan holds,
// cannot be written and reads back as ::/0); a second round changes
// nothing. Decode, against those services, gives each one back itself for
// their own unchanged encoding, and only *OutputError for the original
// bytes.
func FuzzDecodeBatch(f *testing.F) {
	var e Encoder
	f.Add(slices.Clone(e.Encode(testNode, fuzzInput(), true)))
	f.Add(slices.Clone(e.Encode(plan.Node{}, nil, false)))
	f.Add([]byte("WEIR"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		node, services, full, err := DecodeBatch(data)
		if err != nil {
			return
		}
		var enc Encoder
		node2, services2, full2 := roundTrip(t, &enc, node, services, full)
		if full2 != full || !reflect.DeepEqual(node2, node) ||
			!slices.EqualFunc(services2, services, func(a, b *plan.Service) bool { return a.Equal(encodable(b)) }) {
			t.Fatalf("an accepted batch does not survive encoding again:\n%v %v\n%v %v", node, services, node2, services2)
		}
		if node3, services3, full3 := roundTrip(t, &enc, node2, services2, full2); full3 != full2 ||
			!reflect.DeepEqual(node3, node2) || !slices.EqualFunc(services3, services2, (*plan.Service).Equal) {
			t.Fatalf("a batch encoded twice changes:\n%v\n%v", services2, services3)
		}
		out, err := Decode(services2, enc.Encode(node2, services2, full2))
		if err != nil {
			t.Fatalf("Decode refuses the unchanged encoding of the batch's services: %v", err)
		}
		for i := range out {
			if out[i] != services2[i] {
				t.Fatalf("Decode changed service %d of an unchanged batch", i)
			}
		}
		checkDecode(t, services2, data)
	})
}

// roundTrip encodes a batch with enc and decodes it again.
func roundTrip(t *testing.T, enc *Encoder, node plan.Node, services []*plan.Service, full bool) (plan.Node, []*plan.Service, bool) {
	t.Helper()
	node2, services2, full2, err := DecodeBatch(enc.Encode(node, services, full))
	if err != nil {
		t.Fatalf("an accepted batch, encoded again, is refused: %v", err)
	}
	return node2, services2, full2
}

// encodable returns s as Encode writes it: the affinity clamped to
// MaxAffinitySeconds and source ranges that are not prefixes as ::/0.
func encodable(s *plan.Service) *plan.Service {
	c := s.Clone()
	if c.Affinity != nil {
		c.Affinity.TimeoutSeconds = min(c.Affinity.TimeoutSeconds, MaxAffinitySeconds)
	}
	for i, r := range c.SourceRanges {
		if !r.IsValid() {
			c.SourceRanges[i] = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
	}
	return c
}
