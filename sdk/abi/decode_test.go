package abi

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// batch encodes three services: two of the same shape around a rich one.
func batch(t testing.TB) ([]*plan.Service, []byte) {
	t.Helper()
	in := []*plan.Service{simple("a", "first", 3), rich(), simple("b", "third", 3)}
	var e Encoder
	return in, slices.Clone(e.Encode(testNode, in, true))
}

// recOf returns the offset of service i's record.
func recOf(b []byte, i int) int { return int(u32(b, HeaderSize+4*i)) }

// slotOf returns the offset of endpoint slot j of service i.
func slotOf(b []byte, i, j int) int {
	r := recOf(b, i)
	return r + int(u32(b, r+sEndpointsOff)) + EndpointSize*j
}

func TestDecodeRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(b []byte) []byte
		service int
		field   string
		reason  string
	}{
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, -1, "magic", "0x52494556"},
		{"version", func(b []byte) []byte { put16(b, hVersion, 2); return b }, -1, "version", "2 is not 1"},
		{"number of services", func(b []byte) []byte { put32(b, hCount, 2); return b }, -1, "number of services", "3 were sent"},
		{"short header", func(b []byte) []byte { return b[:20] }, -1, "length", "shorter"},
		{"record table", func(b []byte) []byte { return b[:HeaderSize+4] }, -1, "record table", "past"},
		{"string area", func(b []byte) []byte { put32(b, hStrings, uint32(len(b)+1)); return b }, -1, "string area offset", "outside"},
		{"node name", func(b []byte) []byte { put32(b, hNodeName, 0xfffffff0); return b }, -1, "node name", "outside"},
		{"node zone", func(b []byte) []byte { put32(b, hNodeZone+4, uint32(len(b))); return b }, -1, "node zone", "outside"},
		{"service out of place", func(b []byte) []byte {
			r0, r2 := recOf(b, 0), recOf(b, 2)
			put32(b, HeaderSize, uint32(r2))
			put32(b, HeaderSize+8, uint32(r0))
			return b
		}, 0, "namespace", `"b" is not "a"`},
		{"record offset unaligned", func(b []byte) []byte { put32(b, HeaderSize+4, uint32(recOf(b, 1)+2)); return b }, 1, "record offset", "unaligned"},
		{"record offset outside", func(b []byte) []byte { put32(b, HeaderSize+8, uint32(len(b)-4)); return b }, 2, "record offset", "past the output's end"},
		{"record offset huge", func(b []byte) []byte { put32(b, HeaderSize, 0xfffffffc); return b }, 0, "record offset", "past"},
		{"record size", func(b []byte) []byte { put32(b, recOf(b, 1)+sSize, 64); return b }, 1, "record size", "is 64"},
		{"protocol", func(b []byte) []byte { b[recOf(b, 1)+sProtocol] = 2; return b }, 1, "protocol", "is 2, 1 was sent"},
		{"service flags", func(b []byte) []byte { put16(b, recOf(b, 1)+sFlags, 1); return b }, 1, "flags", "is 1, 3 was sent"},
		{"port", func(b []byte) []byte { put16(b, recOf(b, 0)+sPort, 81); return b }, 0, "port", "is 81, 80 was sent"},
		{"node port", func(b []byte) []byte { put16(b, recOf(b, 1)+sNodePort, 0); return b }, 1, "node port", "30443"},
		{"health-check node port", func(b []byte) []byte { put16(b, recOf(b, 1)+sHealthPort, 1); return b }, 1, "health-check node port", "31000"},
		{"cluster IP count", func(b []byte) []byte { put16(b, recOf(b, 1)+sClusterIPs, 1); return b }, 1, "number of cluster IPs", ""},
		{"external IP count", func(b []byte) []byte { put16(b, recOf(b, 1)+sExternalIPs, 3); return b }, 1, "number of external IPs", ""},
		{"load-balancer IP count", func(b []byte) []byte { put16(b, recOf(b, 1)+sLBIPs, 0); return b }, 1, "number of load-balancer IPs", ""},
		{"source range count", func(b []byte) []byte { put16(b, recOf(b, 1)+sRanges, 0); return b }, 1, "number of source ranges", ""},
		{"label count", func(b []byte) []byte { put16(b, recOf(b, 1)+sLabels, 0); return b }, 1, "number of labels", ""},
		{"annotation count", func(b []byte) []byte { put16(b, recOf(b, 1)+sAnnotations, 9); return b }, 1, "number of annotations", ""},
		{"endpoint array offset", func(b []byte) []byte { put32(b, recOf(b, 1)+sEndpointsOff, 64); return b }, 1, "endpoint array offset", "is 64"},
		{"name", func(b []byte) []byte {
			copy(b[recOf(b, 2)+sName:], b[recOf(b, 0)+sName:recOf(b, 0)+sName+strSize])
			return b
		}, 2, "name", `"first" is not "third"`},
		{"port name", func(b []byte) []byte { put32(b, recOf(b, 0)+sPortName+4, 0); return b }, 0, "port name", `"" is not "http"`},
		{"namespace outside", func(b []byte) []byte { put32(b, recOf(b, 0)+sNamespace, uint32(len(b))); return b }, 0, "namespace", "outside"},
		{"cluster IP", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+15]++; return b }, 1, "cluster IP 0", "10.96.0.21 is not 10.96.0.20"},
		{"second cluster IP", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+16]++; return b }, 1, "cluster IP 1", "is not fd00::20"},
		{"external IP", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+16*3+1]++; return b }, 1, "external IP 1", "2001:db8::7"},
		{"load-balancer IP", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+16*4+15]++; return b }, 1, "load-balancer IP 0", "198.51.100.9"},
		{"source range address", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+16*6+13]++; return b }, 1, "source range 0", "203.0.113.0/24"},
		{"source range bits", func(b []byte) []byte { b[recOf(b, 1)+ServiceHeaderSize+16*6+20+16] = 32; return b }, 1, "source range 1", "2001:db8:2::/48"},
		{"label string outside", func(b []byte) []byte {
			put32(b, recOf(b, 1)+shapeOf(rich(), EndpointSize).pairsOff()+12, 0xffffffff)
			return b
		}, 1, "labels and annotations", "outside"},
		{"affinity", func(b []byte) []byte { put32(b, recOf(b, 0)+sAffinity, MaxAffinitySeconds+1); return b }, 0, "affinity", "86401 seconds"},
		{"scheduler", func(b []byte) []byte { b[recOf(b, 1)+sScheduler] = 7; return b }, 1, "scheduler", "unknown code 7"},
		{"more endpoints", func(b []byte) []byte { put32(b, recOf(b, 2)+sEndpoints, 4); return b }, 2, "number of endpoints", "4 is above the 3 sent"},
		{"endpoint id out of range", func(b []byte) []byte { put32(b, slotOf(b, 1, 3)+eID, 4); return b }, 1, "endpoint 3", "id 4 is out of range [0,4)"},
		{"endpoint id repeated", func(b []byte) []byte {
			copy(b[slotOf(b, 0, 2):], b[slotOf(b, 0, 0):slotOf(b, 0, 1)])
			return b
		}, 0, "endpoint 2", "id 0 is repeated"},
		{"endpoint id repeated after a move", func(b []byte) []byte {
			copy(b[slotOf(b, 0, 0):], b[slotOf(b, 0, 1):slotOf(b, 0, 2)])
			return b
		}, 0, "endpoint 1", "id 1 is repeated"},
		{"endpoint address", func(b []byte) []byte { b[slotOf(b, 2, 2)+15] = 99; return b }, 2, "endpoint 2", "address 10.1.0.99 is not the address of endpoint id 2"},
		{"endpoint id swapped without its record", func(b []byte) []byte {
			put32(b, slotOf(b, 0, 0)+eID, 1)
			put32(b, slotOf(b, 0, 1)+eID, 0)
			return b
		}, 0, "endpoint 0", "address 10.1.0.1 is not the address of endpoint id 1"},
		{"endpoint port", func(b []byte) []byte { put16(b, slotOf(b, 1, 1)+ePort, 1); return b }, 1, "endpoint 1", "port 1 is not the port"},
		{"endpoint flags", func(b []byte) []byte { put16(b, slotOf(b, 1, 2)+eFlags, 0); return b }, 1, "endpoint 2", "flags 0 are not the flags"},
		{"endpoint string outside", func(b []byte) []byte { put32(b, slotOf(b, 1, 0)+ePod+4, 0x7fffffff); return b }, 1, "endpoint 0", "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, b := batch(t)
			out, err := Decode(in, tc.mutate(b))
			var oe *OutputError
			if !errors.As(err, &oe) {
				t.Fatalf("got %v, %v; want an *OutputError", out, err)
			}
			if oe.Service != tc.service || oe.Field != tc.field || !strings.Contains(oe.Reason, tc.reason) {
				t.Errorf("got service %d field %q reason %q; want service %d field %q reason containing %q",
					oe.Service, oe.Field, oe.Reason, tc.service, tc.field, tc.reason)
			}
			if tc.service >= 0 && oe.Key != in[tc.service].Key {
				t.Errorf("error key %v, want %v", oe.Key, in[tc.service].Key)
			}
			if out != nil {
				t.Errorf("got services with an error")
			}
		})
	}
}

func TestOutputErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		err  OutputError
		want string
	}{
		{OutputError{Service: 3, Key: plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP},
			Field: "endpoint 2", Reason: "address 10.0.0.9 is not the address of endpoint id 5"},
			"service 3 (default/web:http/TCP): endpoint 2: address 10.0.0.9 is not the address of endpoint id 5"},
		{OutputError{Service: -1, Field: "magic", Reason: "0x0 is not 0x52494557"}, "batch header: magic: 0x0 is not 0x52494557"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

func TestDecodeAllows(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(b *Batch)
		changed []int                                     // services that must come back as new values
		check   func(t *testing.T, in, out *plan.Service) // run on service 1 (rich)
	}{
		{"nothing", func(*Batch) {}, nil, nil},
		{"unread fields", func(b *Batch) {
			buf := b.Bytes()
			put16(buf, hFlags, 0)                                                 // the Full flag
			put16(buf, recOf(buf, 1)+14, 7)                                       // reserved
			put32(buf, recOf(buf, 1)+shapeOf(rich(), EndpointSize).pairsOff(), 0) // a label's key
			put32(buf, slotOf(buf, 1, 1)+ePod+4, 2)                               // an endpoint's pod name
			buf[slotOf(buf, 1, 1)+eNode]++                                        // an endpoint's node name
		}, nil, nil},
		{"reweight", func(b *Batch) { b.Service(1).Endpoint(2).SetWeight(42) }, []int{1}, func(t *testing.T, in, out *plan.Service) {
			want := slices.Clone(in.Endpoints)
			want[2].Weight = 42
			if !slices.Equal(out.Endpoints, want) {
				t.Errorf("endpoints %v, want %v", out.Endpoints, want)
			}
		}},
		{"reweight to the same", func(b *Batch) { b.Service(1).Endpoint(1).SetWeight(7) }, nil, nil},
		{"drop with Keep", func(b *Batch) {
			b.Service(1).Keep(func(e Endpoint) bool { return e.ID()%2 == 1 })
		}, []int{1}, func(t *testing.T, in, out *plan.Service) {
			if want := []plan.Endpoint{in.Endpoints[1], in.Endpoints[3]}; !slices.Equal(out.Endpoints, want) {
				t.Errorf("endpoints %v, want %v", out.Endpoints, want)
			}
		}},
		{"drop all", func(b *Batch) { b.Service(0).Keep(func(Endpoint) bool { return false }) }, []int{0}, nil},
		{"swap", func(b *Batch) { b.Service(1).Swap(0, 3) }, []int{1}, func(t *testing.T, in, out *plan.Service) {
			want := []plan.Endpoint{in.Endpoints[3], in.Endpoints[1], in.Endpoints[2], in.Endpoints[0]}
			if !slices.Equal(out.Endpoints, want) {
				t.Errorf("endpoints %v, want %v", out.Endpoints, want)
			}
		}},
		{"sort and reweight", func(b *Batch) {
			s := b.Service(1)
			s.SortEndpoints(func(a, b Endpoint) bool { return a.Weight() > b.Weight() })
			s.Endpoint(0).SetWeight(1)
		}, []int{1}, func(t *testing.T, in, out *plan.Service) {
			want := []plan.Endpoint{in.Endpoints[3], in.Endpoints[1], in.Endpoints[0], in.Endpoints[2]}
			want[0].Weight = 1
			if !slices.Equal(out.Endpoints, want) {
				t.Errorf("endpoints %v, want %v", out.Endpoints, want)
			}
		}},
		{"clear affinity", func(b *Batch) { b.Service(1).SetAffinity(0) }, []int{1}, func(t *testing.T, in, out *plan.Service) {
			if out.Affinity != nil {
				t.Errorf("affinity %v, want none", out.Affinity)
			}
		}},
		{"set affinity", func(b *Batch) { b.Service(1).SetAffinity(60) }, []int{1}, func(t *testing.T, in, out *plan.Service) {
			if out.Affinity == nil || out.Affinity.TimeoutSeconds != 60 || in.Affinity.TimeoutSeconds != 10800 {
				t.Errorf("affinity %v (sent %v), want 60", out.Affinity, in.Affinity)
			}
		}},
		{"set the same affinity", func(b *Batch) { b.Service(1).SetAffinity(10800) }, nil, nil},
		{"scheduler", func(b *Batch) {
			if err := b.Service(1).SetScheduler(plan.SchedulerSourceHash); err != nil {
				panic(err)
			}
		}, []int{1}, func(t *testing.T, in, out *plan.Service) {
			if out.Scheduler != plan.SchedulerSourceHash {
				t.Errorf("scheduler %q, want sh", out.Scheduler)
			}
		}},
		{"record moved to a new place", func(b *Batch) {
			buf := b.Bytes()
			r := recOf(buf, 2)
			rec := slices.Clone(buf[r : r+int(u32(buf, r+sSize))])
			buf = append(buf, make([]byte, (4-len(buf)%4)%4)...)
			put32(buf, HeaderSize+8, uint32(len(buf)))
			b.buf = append(buf, rec...)
		}, nil, nil},
		{"trailing bytes", func(b *Batch) { b.buf = append(b.buf, 1, 2, 3) }, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, buf := batch(t)
			sent := make([]*plan.Service, len(in))
			for i, s := range in {
				sent[i] = s.Clone()
			}
			b, err := Parse(buf)
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(b)
			out, err := Decode(in, b.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			for i := range in {
				if !in[i].Equal(sent[i]) {
					t.Errorf("Decode modified input service %d", i)
				}
				if (out[i] != in[i]) != slices.Contains(tc.changed, i) {
					t.Errorf("service %d: same pointer %v, want changed %v", i, out[i] == in[i], slices.Contains(tc.changed, i))
				}
				if !out[i].SameRules(in[i]) {
					a, b := *out[i], *in[i]
					a.Endpoints, a.Affinity, a.Scheduler = nil, nil, ""
					b.Endpoints, b.Affinity, b.Scheduler = nil, nil, ""
					if !a.Equal(&b) {
						t.Errorf("service %d: fields other than endpoints, affinity and scheduler changed", i)
					}
				}
			}
			if tc.check != nil {
				tc.check(t, in[1], out[1])
			}
		})
	}
}

func TestDecodeKeepsUnencodedValues(t *testing.T) {
	in := []*plan.Service{simple("a", "b", 1), simple("a", "c", 1)}
	in[0].Affinity = &plan.Affinity{TimeoutSeconds: 0}
	in[1].Affinity = &plan.Affinity{TimeoutSeconds: MaxAffinitySeconds + 5}
	var e Encoder
	out, err := Decode(in, e.Encode(testNode, in, false))
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != in[0] || out[1] != in[1] {
		t.Error("a service whose encoded values are unchanged did not come back as itself")
	}
}

func TestDecodeUnchangedAllocs(t *testing.T) {
	in := make([]*plan.Service, 100)
	for i := range in {
		in[i] = simple("ns", "svc", 10)
	}
	in[0] = rich()
	var e Encoder
	buf := e.Encode(testNode, in, true)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := Decode(in, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("Decode of an unchanged batch made %v allocations, want 1 (the result slice)", allocs)
	}
}
