package abi

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

func TestRoundTrip(t *testing.T) {
	many := make([]*plan.Service, 300)
	for i := range many {
		many[i] = simple("ns-"+strconv.Itoa(i%7), "svc-"+strconv.Itoa(i), i%5)
	}
	udp := simple("kube-system", "dns", 2)
	udp.Key.Protocol, udp.Key.Port, udp.Port = plan.UDP, "", 53
	sctp := simple("x", "sctp", 1)
	sctp.Key.Protocol = plan.SCTP
	v6 := simple("x", "v6only", 0)
	v6.ClusterIPs = addrs("fd00::1")
	v6.Endpoints = []plan.Endpoint{ep("fd00:1::2", 80, "", "", "", 3)}
	for _, tc := range []struct {
		name     string
		node     plan.Node
		services []*plan.Service
		full     bool
	}{
		{"empty batch", plan.Node{}, nil, false},
		{"empty strings", plan.Node{}, []*plan.Service{{Key: plan.Key{Protocol: plan.TCP}}}, true},
		{"rich dual-stack", testNode, []*plan.Service{rich()}, true},
		{"protocols", testNode, []*plan.Service{udp, sctp, v6}, false},
		{"many services", testNode, many, true},
		{"mixed", plan.Node{Name: "n", Zone: ""}, []*plan.Service{rich(), simple("a", "b", 0), rich(), udp}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e Encoder
			buf := e.Encode(tc.node, tc.services, tc.full)
			node, got, full, err := DecodeBatch(buf)
			if err != nil {
				t.Fatal(err)
			}
			if node.Name != tc.node.Name || node.Zone != tc.node.Zone || full != tc.full {
				t.Errorf("header: got node %q/%q full %v, want %q/%q %v", node.Name, node.Zone, full, tc.node.Name, tc.node.Zone, tc.full)
			}
			if len(got) != len(tc.services) {
				t.Fatalf("got %d services, want %d", len(got), len(tc.services))
			}
			for i, want := range tc.services {
				if !got[i].Equal(want) {
					t.Errorf("service %d:\n got %s\nwant %s", i, got[i], want)
				}
			}
			// The encoder reuses its buffers: a second batch must not be corrupted by the first.
			again := e.Encode(tc.node, tc.services, tc.full)
			if string(again) != string(buf) {
				t.Error("re-encoding the same batch gave different bytes")
			}
		})
	}
}

func TestEncodeRepeatedStringsOnce(t *testing.T) {
	s := simple("default", "web", 30) // 3 node names, 2 zones, 30 pods
	var e Encoder
	buf := e.Encode(plan.Node{Name: "node-1", Zone: "zone-0"}, []*plan.Service{s, s}, true)
	area := buf[binary.LittleEndian.Uint32(buf[12:]):]
	want := len("default") + len("web") + len("http") + len("node-0node-1node-2") + len("zone-0zone-1")
	for i := range 30 {
		want += 2 * len("web-pod-"+strconv.Itoa(i)) // pod names are not looked up: once per endpoint
	}
	if len(area) != want {
		t.Errorf("string area is %d bytes, want %d (every string but pod names once)", len(area), want)
	}
}

func TestEncodeNormalises(t *testing.T) {
	s := simple("a", "b", 1)
	s.Affinity = &plan.Affinity{TimeoutSeconds: 999999}
	s.Scheduler = "bogus"
	var e Encoder
	_, got, _, err := DecodeBatch(e.Encode(testNode, []*plan.Service{s}, false))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Affinity == nil || got[0].Affinity.TimeoutSeconds != MaxAffinitySeconds {
		t.Errorf("affinity %v, want clamped to %d", got[0].Affinity, MaxAffinitySeconds)
	}
	if got[0].Scheduler != plan.SchedulerDefault {
		t.Errorf("unknown scheduler sent as %q, want the default", got[0].Scheduler)
	}
}

// TestLayout checks the bytes of a small batch against docs/plugin-abi.md,
// with offsets written out by hand rather than taken from the constants.
func TestLayout(t *testing.T) {
	s := &plan.Service{
		Key:         plan.Key{Namespace: "ns", Name: "svc", Port: "p", Protocol: plan.UDP},
		ClusterIPs:  addrs("10.0.0.1"),
		ExternalIPs: addrs("2001:db8::1"),
		Port:        53, NodePort: 30053, HealthCheckNodePort: 31053,
		SourceRanges:  []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ExternalLocal: true,
		Affinity:      &plan.Affinity{TimeoutSeconds: 60},
		Scheduler:     plan.SchedulerWeightedLeastConnection,
		Labels:        map[string]string{"k": "v"},
		Endpoints: []plan.Endpoint{{Address: netip.MustParseAddr("10.1.2.3"), Port: 5353, NodeName: "ns",
			Zone: "z", Pod: "pod", Ready: true, ForLocal: true, Weight: 9}},
	}
	var e Encoder
	b := e.Encode(plan.Node{Name: "node"}, []*plan.Service{s}, true)
	u16 := func(o int) int { return int(binary.LittleEndian.Uint16(b[o:])) }
	u32 := func(o int) int { return int(binary.LittleEndian.Uint32(b[o:])) }
	str := func(o int) string { return string(b[u32(o) : u32(o)+u32(o+4)]) }
	rec := 36
	size := 64 + 2*16 + 20 + 16 + 52
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"magic bytes", string(b[0:4]), "WEIR"},
		{"version", u16(4), 1},
		{"flags", u16(6), 1},
		{"count", u32(8), 1},
		{"string area", u32(12), rec + size},
		{"node name", str(16), "node"},
		{"node zone", [2]int{u32(24), u32(28)}, [2]int{0, 0}},
		{"record offset", u32(32), rec},
		{"record size", u32(rec), size},
		{"protocol", int(b[rec+4]), 2},
		{"scheduler", int(b[rec+5]), 4},
		{"service flags", u16(rec + 6), 1},
		{"port", u16(rec + 8), 53},
		{"node port", u16(rec + 10), 30053},
		{"health port", u16(rec + 12), 31053},
		{"reserved", u16(rec + 14), 0},
		{"affinity", u32(rec + 16), 60},
		{"endpoints", u32(rec + 20), 1},
		{"namespace", str(rec + 24), "ns"},
		{"name", str(rec + 32), "svc"},
		{"port name", str(rec + 40), "p"},
		{"counts", [6]int{u16(rec + 48), u16(rec + 50), u16(rec + 52), u16(rec + 54), u16(rec + 56), u16(rec + 58)}, [6]int{1, 1, 0, 1, 1, 0}},
		{"endpoint array offset", u32(rec + 60), 64 + 32 + 20 + 16},
		{"cluster IP", netip.AddrFrom16([16]byte(b[rec+64:])), netip.MustParseAddr("::ffff:10.0.0.1")},
		{"external IP", netip.AddrFrom16([16]byte(b[rec+80:])), netip.MustParseAddr("2001:db8::1")},
		{"range address", netip.AddrFrom16([16]byte(b[rec+96:])), netip.MustParseAddr("::ffff:10.0.0.0")},
		{"range bits and padding", [4]byte(b[rec+112:]), [4]byte{8, 0, 0, 0}},
		{"label", str(rec+116) + "=" + str(rec+124), "k=v"},
		{"endpoint address", netip.AddrFrom16([16]byte(b[rec+132:])), netip.MustParseAddr("::ffff:10.1.2.3")},
		{"endpoint port", u16(rec + 148), 5353},
		{"endpoint flags", u16(rec + 150), 1 | 32},
		{"endpoint weight", u32(rec + 152), 9},
		{"endpoint id", u32(rec + 156), 0},
		{"endpoint node", str(rec + 160), "ns"},
		{"endpoint node shares the namespace's bytes", u32(rec + 160), u32(rec + 24)},
		{"endpoint zone", str(rec + 168), "z"},
		{"endpoint pod", str(rec + 176), "pod"},
		{"total", len(b), rec + size + len("node") + len("ns") + len("svc") + len("p") + len("kv") + len("z") + len("pod")},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
}
