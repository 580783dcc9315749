package abi

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

func TestViews(t *testing.T) {
	in, buf := batch(t)
	b, err := Parse(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Full() || b.NodeName() != "node-a" || b.NodeZone() != "zone-1" || b.Len() != 3 {
		t.Errorf("header: full %v node %q zone %q len %d", b.Full(), b.NodeName(), b.NodeZone(), b.Len())
	}
	s, want := b.Service(1), in[1]
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"key", s.Key(), want.Key},
		{"port", s.Port(), want.Port},
		{"node port", s.NodePort(), want.NodePort},
		{"health port", s.HealthCheckNodePort(), want.HealthCheckNodePort},
		{"external local", s.ExternalLocal(), true},
		{"internal local", s.InternalLocal(), true},
		{"cluster IPs", slices.Equal(s.ClusterIPs(), want.ClusterIPs), true},
		{"external IPs", slices.Equal(s.ExternalIPs(), want.ExternalIPs), true},
		{"load-balancer IPs", slices.Equal(s.LoadBalancerIPs(), want.LoadBalancerIPs), true},
		{"source ranges", slices.Equal(s.SourceRanges(), want.SourceRanges), true},
		{"affinity", s.AffinitySeconds(), uint32(10800)},
		{"scheduler", s.Scheduler(), plan.SchedulerMaglevHash},
		{"len", s.Len(), 4},
		{"endpoint 1", s.Endpoint(1).AddrPort(), netip.MustParseAddrPort("[fd00:1::1]:8443")},
		{"endpoint 1 node", s.Endpoint(1).NodeName() + "/" + s.Endpoint(1).Zone() + "/" + s.Endpoint(1).Pod(), "node-b/zone-2/web-1"},
		{"endpoint 3 flags", [6]bool{s.Endpoint(3).Ready(), s.Endpoint(3).Serving(), s.Endpoint(3).Terminating(),
			s.Endpoint(3).Local(), s.Endpoint(3).ForCluster(), s.Endpoint(3).ForLocal()}, [6]bool{true, true, true, true, true, true}},
		{"endpoint 2 flags", [6]bool{s.Endpoint(2).Ready(), s.Endpoint(2).Serving(), s.Endpoint(2).Terminating(),
			s.Endpoint(2).Local(), s.Endpoint(2).ForCluster(), s.Endpoint(2).ForLocal()}, [6]bool{false, true, true, false, false, false}},
		{"endpoint 3 weight", s.Endpoint(3).Weight(), uint32(0xffffffff)},
		{"endpoint 0 address is IPv4", s.Endpoint(0).Address().Is4(), true},
		{"simple service has no source ranges", b.Service(0).SourceRanges() == nil, true},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
}

func TestLabelLookup(t *testing.T) {
	_, buf := batch(t)
	b, err := Parse(buf)
	if err != nil {
		t.Fatal(err)
	}
	s := b.Service(1)
	for k, v := range rich().Labels {
		if got, ok := s.Label(k); !ok || got != v {
			t.Errorf("Label(%q) = %q, %v; want %q", k, got, ok, v)
		}
		if _, ok := s.Annotation(k); ok && k != "" {
			t.Errorf("Annotation(%q) found a label", k)
		}
	}
	for k, v := range rich().Annotations {
		if got, ok := s.Annotation(k); !ok || got != v {
			t.Errorf("Annotation(%q) = %q, %v; want %q", k, got, ok, v)
		}
	}
	for _, k := range []string{"ap", "apps", "zz", "0", "weir.io"} {
		if v, ok := s.Label(k); ok {
			t.Errorf("Label(%q) = %q, want none", k, v)
		}
	}
	if _, ok := b.Service(0).Label("app"); ok {
		t.Error("a service without labels has one")
	}
}

func TestSetters(t *testing.T) {
	_, buf := batch(t)
	b, err := Parse(buf)
	if err != nil {
		t.Fatal(err)
	}
	s := b.Service(0)
	s.SetAffinity(1 << 30)
	if s.AffinitySeconds() != MaxAffinitySeconds {
		t.Errorf("affinity %d, want clamped to %d", s.AffinitySeconds(), MaxAffinitySeconds)
	}
	if err := s.SetScheduler("fastest"); err == nil || !strings.Contains(err.Error(), `"fastest"`) {
		t.Errorf("SetScheduler(fastest) = %v, want an error naming it", err)
	}
	for _, sc := range plan.Schedulers {
		if err := s.SetScheduler(sc); err != nil || s.Scheduler() != sc {
			t.Errorf("SetScheduler(%q) = %v, reads back %q", sc, err, s.Scheduler())
		}
	}
}

func TestKeepAndSort(t *testing.T) {
	svc := simple("a", "b", 9)
	for i := range svc.Endpoints {
		svc.Endpoints[i].Weight = uint32(i % 3) // 0 1 2 0 1 2 0 1 2
	}
	var e Encoder
	b, err := Parse(e.Encode(testNode, []*plan.Service{svc}, false))
	if err != nil {
		t.Fatal(err)
	}
	s := b.Service(0)
	ids := func() []uint32 {
		var out []uint32
		for i := range s.Len() {
			out = append(out, s.Endpoint(i).ID())
		}
		return out
	}
	s.SortEndpoints(func(a, b Endpoint) bool { return a.Weight() > b.Weight() })
	if got, want := ids(), []uint32{2, 5, 8, 1, 4, 7, 0, 3, 6}; !slices.Equal(got, want) {
		t.Errorf("after a stable sort by weight: ids %v, want %v", got, want)
	}
	if n := s.Keep(func(e Endpoint) bool { return e.Weight() != 1 }); n != 6 || s.Len() != 6 {
		t.Errorf("Keep returned %d, Len %d; want 6", n, s.Len())
	}
	if got, want := ids(), []uint32{2, 5, 8, 0, 3, 6}; !slices.Equal(got, want) {
		t.Errorf("after Keep: ids %v, want %v", got, want)
	}
	if s.Endpoint(3).Address() != svc.Endpoints[0].Address {
		t.Errorf("slot 3 holds %v, want endpoint 0's address", s.Endpoint(3).Address())
	}
	s.Swap(0, 5)
	if got, want := ids(), []uint32{6, 5, 8, 0, 3, 2}; !slices.Equal(got, want) {
		t.Errorf("after Swap: ids %v, want %v", got, want)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "endpoint index 6") {
			t.Errorf("Endpoint(6) after Keep: recovered %v, want an index panic", r)
		}
	}()
	s.Endpoint(6)
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(b []byte) []byte
		want   string
	}{
		{"empty", func([]byte) []byte { return nil }, "shorter than its header"},
		{"magic", func(b []byte) []byte { b[3] = 0; return b }, "bad magic"},
		{"version", func(b []byte) []byte { put16(b, hVersion, 9); return b }, "version 9"},
		{"count", func(b []byte) []byte { put32(b, hCount, 1<<30); return b }, "record table"},
		{"string area", func(b []byte) []byte { put32(b, hStrings, 1<<31); return b }, "string area"},
		{"node name", func(b []byte) []byte { put32(b, hNodeName+4, 1<<31); return b }, "node name"},
		{"record unaligned", func(b []byte) []byte { put32(b, HeaderSize, 1); return b }, "service 0: record offset 1"},
		{"record outside", func(b []byte) []byte { put32(b, HeaderSize+4, uint32(len(b))); return b }, "service 1: record offset"},
		{"record in the table", func(b []byte) []byte { put32(b, HeaderSize, HeaderSize+4); return b }, "service 0: record offset 36 overlaps"},
		{"records out of order", func(b []byte) []byte { put32(b, HeaderSize+4, uint32(recOf(b, 0))); return b }, "service 1: record offset 44 overlaps"},
		{"record size", func(b []byte) []byte { put32(b, recOf(b, 2)+sSize, 1<<31); return b }, "service 2: record size"},
		{"too many endpoints", func(b []byte) []byte { put32(b, recOf(b, 2)+sEndpoints, 4); return b }, "service 2: endpoint array of 4"},
		{"endpoint array overlap", func(b []byte) []byte { put32(b, recOf(b, 1)+sEndpointsOff, 64); return b }, "service 1: endpoint array offset"},
		{"address count", func(b []byte) []byte { put16(b, recOf(b, 1)+sClusterIPs, 300); return b }, "service 1: endpoint array offset"},
		{"key string", func(b []byte) []byte { put32(b, recOf(b, 0)+sName, uint32(len(b))); return b }, "key string"},
		{"label string", func(b []byte) []byte {
			put32(b, recOf(b, 1)+shapeOf(rich(), EndpointSize).pairsOff()+4, 1<<20)
			return b
		}, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, buf := batch(t)
			_, err := Parse(tc.mutate(buf))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if _, _, _, err2 := DecodeBatch(tc.mutate(slices.Clone(buf))); err2 == nil {
				t.Error("DecodeBatch accepted it")
			}
		})
	}
}

func TestStatusString(t *testing.T) {
	for s, want := range map[Status]string{
		StatusOK: "OK", StatusBadInput: "BadInput", StatusPanic: "Panic", StatusFailed: "Failed",
		StatusBadConfig: "BadConfig", 9: "Status(9)",
	} {
		if s.String() != want {
			t.Errorf("%d: got %q, want %q", uint32(s), s.String(), want)
		}
	}
}

// An endpoint string outside the batch is not looked for by Parse (that
// would cost a pass over every endpoint); it reads as empty.
func TestEndpointStringOutsideReadsEmpty(t *testing.T) {
	_, buf := batch(t)
	put32(buf, slotOf(buf, 2, 2)+eZone, 1<<20)
	b, err := Parse(buf)
	if err != nil {
		t.Fatal(err)
	}
	if z := b.Service(2).Endpoint(2).Zone(); z != "" {
		t.Errorf("Zone() = %q, want empty", z)
	}
}
