package hooks

import (
	"slices"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// TestExamplePlugins runs each example plugin of plugins/, built for
// wasip1, through the real host: the round trip its native sdktest tests
// cannot show.
func TestExamplePlugins(t *testing.T) {
	ep := func(addr, node, zone, pod string) plan.Endpoint {
		return sdktest.Endpoint(addr, 8080, node, zone, pod)
	}
	web := func(annotations map[string]string) *plan.Service {
		s := sdktest.Service("shop", "web", "10.96.0.10", 80,
			ep("10.244.1.1", "node-a", "zone-a", "web-7d9f-1"),
			ep("10.244.1.2", "node-b", "zone-b", "web-7d9f-2"),
			ep("10.244.1.3", "node-a", "zone-a", "web-canary-5c4b-1"))
		s.Annotations = annotations
		return s
	}
	tests := []struct {
		name   string
		config any
		in     *plan.Service
		check  func(t *testing.T, out *plan.Service)
	}{
		{"canary", nil, web(map[string]string{"canary.weir.dev/split": "web-canary=10"}),
			func(t *testing.T, out *plan.Service) {
				// The canary's one endpoint gets 10%: 2 of 9+9+2.
				if w := weights(out); !slices.Equal(w, []uint32{9, 9, 2}) {
					t.Errorf("weights %v, want [9 9 2]", w)
				}
			}},
		{"zone-preference", map[string]any{"minEndpoints": 2}, web(nil),
			func(t *testing.T, out *plan.Service) {
				if got := addrs(out); !slices.Equal(got, []string{"10.244.1.1", "10.244.1.3"}) {
					t.Errorf("endpoints %v, want the two in zone-a", got)
				}
			}},
		{"drain", map[string]any{"patterns": []any{"node-b*"}}, web(nil),
			func(t *testing.T, out *plan.Service) {
				if got := addrs(out); !slices.Equal(got, []string{"10.244.1.1", "10.244.1.3"}) {
					t.Errorf("endpoints %v, want node-b's drained", got)
				}
			}},
		{"affinity", nil, web(map[string]string{"affinity.weir.dev/client-ip": "10m"}),
			func(t *testing.T, out *plan.Service) {
				if out.Affinity == nil || out.Affinity.TimeoutSeconds != 600 {
					t.Errorf("affinity %+v, want ClientIP for 600 s", out.Affinity)
				}
			}},
	}
	node := plan.Node{Name: "node-a", Zone: "zone-a"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, logs := newChain(t, Options{}, Config{Name: tc.name, Path: guest(tc.name), Config: tc.config, FailurePolicy: PolicyClosed})
			in := []*plan.Service{tc.in}
			out, err := c.Apply(t.Context(), node, in, true)
			if err != nil {
				t.Fatalf("Apply: %v\n%s", err, logs)
			}
			assertSubset(t, in, out)
			tc.check(t, out[0])
		})
	}
}

func addrs(s *plan.Service) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Address.String())
	}
	return out
}

// TestExampleLeastConn runs plugins/least-conn, built for wasip1, with
// live signals through the real host: after a reading that finds one
// endpoint loaded, that endpoint is weighted down; once its load is gone,
// the plugin's output is the planned service again.
func TestExampleLeastConn(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	cfg := Config{Name: "least-conn", Path: guest("least-conn"), Signals: []string{SignalConnections},
		Interval: time.Second, FailurePolicy: PolicyClosed}
	c, logs := newChain(t, Options{Now: clk.Now}, cfg)
	web := svc("shop", "web", 3)
	in := []*plan.Service{web}
	if out, err := apply(c, in, true); err != nil || out[0] != web {
		t.Fatalf("Apply without signals: %v, changed %v\n%s", err, out[0] != web, logs)
	}
	src := &fakeSignals{}
	src.set(web, 0, abi.Signals{Active: 12})
	if keys := poll(t, c, src); len(keys) != 1 {
		t.Fatalf("Poll: keys %v", keys)
	}
	out, err := apply(c, in, false)
	if err != nil {
		t.Fatalf("Apply: %v\n%s", err, logs)
	}
	assertSubset(t, in, out)
	if w := weights(out[0]); !slices.Equal(w, []uint32{8, 100, 100}) {
		t.Errorf("weights with 12 connections on the first endpoint: %v, want [8 100 100]", w)
	}
	src.set(web, 0, abi.Signals{})
	clk.advance(time.Second)
	poll(t, c, src)
	if out, _ := apply(c, in, false); out[0] != web {
		t.Errorf("without load the output is %v, want the planned service", weights(out[0]))
	}
}
