package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

var node = plan.Node{Name: "node-1", Zone: "zone-a"}

func ep(addr, node string) plan.Endpoint {
	return sdktest.Endpoint(addr, 8080, node, "zone-a", "web-"+addr)
}

func service(eps ...plan.Endpoint) *plan.Service {
	return sdktest.Service("default", "web", "10.96.0.10", 80, eps...)
}

func idle(e plan.Endpoint) plan.Endpoint {
	e.Ready, e.ForCluster = false, false
	return e
}

func weighted(e plan.Endpoint, w uint32) plan.Endpoint {
	e.Weight = w
	return e
}

// describe lists a service's endpoints as address/weight.
func describe(s *plan.Service) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Address.String()+"/"+string(rune('0'+min(e.Weight, 9))))
	}
	return out
}

func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := logOut
	logOut = &buf
	t.Cleanup(func() { logOut = old })
	return &buf
}

func TestDrain(t *testing.T) {
	const oldNode = `{"nodes":["node-old"]}`
	a, b, c := ep("10.0.0.1", "node-1"), ep("10.0.0.2", "node-old"), ep("10.0.0.3", "pool-old-7")
	v6a, v6b := ep("fd00::1", "node-1"), ep("fd00::2", "node-old")
	tests := []struct {
		name   string
		config string
		in     *plan.Service
		want   []string // nil: unchanged
		log    string   // a substring of the one log line, "" for none
	}{
		{"no config", "", service(a, b), nil, ""},
		{"empty lists", `{"nodes":[],"patterns":[]}`, service(a, b), nil, ""},
		{"by name", oldNode, service(a, b, c), []string{"10.0.0.1/1", "10.0.0.3/1"}, ""},
		{"by pattern", `{"patterns":["pool-old-*"]}`, service(a, b, c), []string{"10.0.0.1/1", "10.0.0.2/1"}, ""},
		{"name and pattern", `{"nodes":["node-old"],"patterns":["pool-old-?"]}`, service(a, b, c), []string{"10.0.0.1/1"}, ""},
		{"pattern must match the whole name", `{"patterns":["pool-old"]}`, service(a, c), nil, ""},
		{"nothing on drained nodes", oldNode, service(a, c), nil, ""},
		{"keepLast", oldNode, service(b), nil, "every serving IPv4 endpoint is on a drained node"},
		{"keepLast counts serving endpoints only", oldNode, service(idle(a), b), nil, "keepLast"},
		{"keepLast ignores drained weights", oldNode, service(weighted(a, 0), b), nil, "keepLast"},
		{"keepLast off", `{"nodes":["node-old"],"keepLast":false}`, service(b), []string{}, ""},
		{"no serving endpoint to protect", oldNode, service(idle(a), idle(b)), []string{"10.0.0.1/1"}, ""},
		{"weight0", `{"nodes":["node-old"],"mode":"weight0"}`, service(a, b, c), []string{"10.0.0.1/1", "10.0.0.2/0", "10.0.0.3/1"}, ""},
		{"weight0 keepLast", `{"nodes":["node-old"],"mode":"weight0"}`, service(b), nil, "keepLast"},
		{"weight0 keepLast off", `{"nodes":["node-old"],"mode":"weight0","keepLast":false}`, service(b), []string{"10.0.0.2/0"}, ""},
		{"families separately", oldNode, service(b, v6a, v6b), []string{"10.0.0.2/1", "fd00::1/1"}, "every serving IPv4 endpoint"},
		{"no node name never drained", `{"patterns":["*"],"keepLast":false}`, service(a, ep("10.0.0.9", "")), []string{"10.0.0.9/1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := captureLog(t)
			out, err := sdktest.Run(plugin, tt.config, node, tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == nil {
				if out[0] != tt.in {
					t.Fatalf("service changed: %v", describe(out[0]))
				}
			} else if got := describe(out[0]); !slices.Equal(got, tt.want) {
				t.Fatalf("endpoints %v, want %v", got, tt.want)
			}
			switch line := log.String(); {
			case tt.log == "" && line != "":
				t.Errorf("unexpected log %q", line)
			case tt.log != "" && (!strings.HasPrefix(line, tt.in.Key.String()+": ") || !strings.Contains(line, tt.log) || strings.Count(line, "\n") != 1):
				t.Errorf("log %q, want one line about %s containing %q", line, tt.in.Key, tt.log)
			}
		})
	}
}

func TestBatch(t *testing.T) {
	captureLog(t)
	one := service(ep("10.0.0.1", "node-1"), ep("10.0.0.2", "node-old"))
	two := service(ep("10.0.0.2", "node-old"))
	two.Key.Name = "two"
	out, err := sdktest.Run(plugin, `{"nodes":["node-old"]}`, node, one, two)
	if err != nil {
		t.Fatal(err)
	}
	if len(out[0].Endpoints) != 1 || out[1] != two {
		t.Fatalf("got %v and %v", describe(out[0]), describe(out[1]))
	}
}

func TestBadConfig(t *testing.T) {
	in := service(ep("10.0.0.1", "node-1"))
	for _, c := range []string{
		`{"patterns":["pool-["]}`, `{"patterns":["a\\"]}`, `{"patterns":[""]}`, `{"nodes":[""]}`, `{"nodes":"node-1"}`,
		`{"mode":"weight"}`, `{"mode":""}`, `{"keepLast":"yes"}`, `{"node":["x"]}`,
	} {
		if _, err := sdktest.Run(plugin, c, node, in); err == nil {
			t.Errorf("config %s accepted", c)
		}
	}
}

// TestExampleConfig checks that the config of config.yaml's entry is accepted.
func TestExampleConfig(t *testing.T) { examples.ExampleConfig(t, plugin, node) }
