package main

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

var node = plan.Node{Name: "node-a1", Zone: "zone-a"}

// ep returns an endpoint named by its last address byte, in the given zone.
func ep(addr, zone string) plan.Endpoint {
	return sdktest.Endpoint(addr, 8080, "node-"+zone, zone, "web-"+addr)
}

func service(eps ...plan.Endpoint) *plan.Service {
	return sdktest.Service("default", "web", "10.96.0.10", 80, eps...)
}

func annotate(s *plan.Service, v string) *plan.Service {
	s.Annotations = map[string]string{disabledAnnotation: v}
	return s
}

func addrs(s *plan.Service) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Address.String())
	}
	return out
}

func weights(s *plan.Service) []uint32 {
	var w []uint32
	for _, e := range s.Endpoints {
		w = append(w, e.Weight)
	}
	return w
}

// notServing marks an endpoint as not ready and carrying no traffic.
func notServing(e plan.Endpoint) plan.Endpoint {
	e.Ready, e.Serving, e.ForCluster = false, false, false
	return e
}

func weighted(e plan.Endpoint, w uint32) plan.Endpoint {
	e.Weight = w
	return e
}

func local(e plan.Endpoint) plan.Endpoint {
	e.Local, e.ForLocal, e.NodeName = true, true, node.Name
	return e
}

func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := logOut
	logOut = &buf
	t.Cleanup(func() { logOut = old })
	return &buf
}

func TestDrop(t *testing.T) {
	a1, a2, a3 := ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-a"), ep("10.0.0.3", "zone-a")
	b1, b2, none := ep("10.0.1.1", "zone-b"), ep("10.0.1.2", "zone-b"), ep("10.0.2.1", "")
	v6a1, v6a2, v6b1 := ep("fd00::a1", "zone-a"), ep("fd00::a2", "zone-a"), ep("fd00::b1", "zone-b")
	tests := []struct {
		name   string
		config string
		node   plan.Node
		in     *plan.Service
		want   []string // nil: unchanged
	}{
		{"enough in zone", "", node, service(b1, a1, b2, a2), []string{"10.0.0.1", "10.0.0.2"}},
		{"too few in zone", "", node, service(b1, a1, b2), nil},
		{"all in zone", "", node, service(a1, a2), nil},
		{"none in zone", "", node, service(b1, b2), nil},
		{"minEndpoints 1", `{"minEndpoints":1}`, node, service(b1, a1, b2), []string{"10.0.0.1"}},
		{"minEndpoints 3", `{"minEndpoints":3}`, node, service(b1, a1, a2), nil},
		{"minEndpoints 3 met", `{"minEndpoints":3}`, node, service(b1, a1, a2, a3), []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}},
		{"node without zone", "", plan.Node{Name: "node-x"}, service(b1, a1, a2), nil},
		{"endpoint without zone is another zone", "", node, service(none, a1, a2), []string{"10.0.0.1", "10.0.0.2"}},
		{"not serving does not count", "", node, service(b1, a1, notServing(a2)), nil},
		{"drained does not count", "", node, service(b1, a1, weighted(a2, 0)), nil},
		{"not serving in zone is kept", "", node, service(b1, a1, a2, notServing(a3)), []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}},
		{"local endpoint without zone is kept", "", node, service(b1, a1, a2, local(none)), []string{"10.0.0.1", "10.0.0.2", "10.0.2.1"}},
		{"families decide separately", "", node, service(b1, v6b1, a1, v6a1, a2), []string{"fd00::b1", "10.0.0.1", "fd00::a1", "10.0.0.2"}},
		{"both families", "", node, service(b1, v6b1, a1, v6a1, a2, v6a2), []string{"10.0.0.1", "fd00::a1", "10.0.0.2", "fd00::a2"}},
		{"disabled", "", node, annotate(service(b1, a1, a2), "true"), nil},
		{"not disabled", "", node, annotate(service(b1, a1, a2), "false"), []string{"10.0.0.1", "10.0.0.2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := captureLog(t)
			out, err := sdktest.Run(plugin, tt.config, tt.node, tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if log.Len() > 0 {
				t.Errorf("unexpected log %q", log)
			}
			if tt.want == nil {
				if out[0] != tt.in {
					t.Fatalf("service changed: %v", addrs(out[0]))
				}
				return
			}
			if got := addrs(out[0]); !slices.Equal(got, tt.want) {
				t.Fatalf("endpoints %v, want %v", got, tt.want)
			}
		})
	}
}

func TestWeight(t *testing.T) {
	a1, a2, b1 := ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-a"), ep("10.0.1.1", "zone-b")
	tests := []struct {
		name   string
		config string
		in     *plan.Service
		want   []uint32 // nil: unchanged
	}{
		{"default multiplier", `{"mode":"weight"}`, service(b1, a1, a2), []uint32{1, 10, 10}},
		{"multiplier 3", `{"mode":"weight","weight":3}`, service(b1, weighted(a1, 2), a2), []uint32{1, 6, 3}},
		{"saturates", `{"mode":"weight"}`, service(b1, weighted(a1, math.MaxUint32/2), a2), []uint32{1, math.MaxUint32, 10}},
		{"too few in zone", `{"mode":"weight"}`, service(b1, a1), nil},
		{"drained stay drained", `{"mode":"weight","minEndpoints":1}`, service(b1, a1, weighted(a2, 0)), []uint32{1, 10, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := sdktest.Run(plugin, tt.config, node, tt.in)
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
		})
	}
}

func TestBadAnnotation(t *testing.T) {
	log := captureLog(t)
	in := annotate(service(ep("10.0.1.1", "zone-b"), ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-a")), "sometimes")
	other := service(ep("10.0.1.1", "zone-b"), ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-a"))
	other.Key.Name = "other"
	out, err := sdktest.Run(plugin, "", node, in, other)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != in {
		t.Fatalf("service with a bad annotation changed: %v", addrs(out[0]))
	}
	if len(out[1].Endpoints) != 2 {
		t.Fatalf("the other service was not processed: %v", addrs(out[1]))
	}
	line := log.String()
	if !strings.HasPrefix(line, in.Key.String()+": annotation "+disabledAnnotation+`="sometimes"`) || strings.Count(line, "\n") != 1 {
		t.Fatalf("log %q", line)
	}
}

func TestBadConfig(t *testing.T) {
	in := service(ep("10.0.0.1", "zone-a"))
	for _, c := range []string{
		`{"minEndpoints":0}`, `{"minEndpoints":-1}`, `{"minEndpoints":"2"}`, `{"mode":"spill"}`, `{"mode":""}`,
		`{"weight":5}`, `{"mode":"weight","weight":1}`, `{"mode":"weight","weight":0}`, `{"minEndpoint":2}`,
	} {
		if _, err := sdktest.Run(plugin, c, node, in); err == nil {
			t.Errorf("config %s accepted", c)
		}
	}
	for _, c := range []string{"", "null", "{}", `{"mode":"drop","minEndpoints":5}`, `{"mode":"weight","weight":2}`} {
		if _, err := sdktest.Run(plugin, c, node, in); err != nil {
			t.Errorf("config %q: %v", c, err)
		}
	}
}

// TestExampleConfig checks that the config of config.yaml's entry is accepted.
func TestExampleConfig(t *testing.T) { examples.ExampleConfig(t, plugin, node) }
