package sdktest

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
)

// zonePlugin drains endpoints outside the configured zone (the node's by default).
func zonePlugin() guest.Plugin {
	var cfg struct {
		Zone string `json:"zone"`
	}
	return guest.Plugin{
		Configure: func(c []byte) error {
			cfg.Zone = ""
			return guest.DecodeConfig(c, &cfg)
		},
		Process: func(b *abi.Batch) error {
			zone := cfg.Zone
			if zone == "" {
				zone = b.NodeZone()
			}
			for i := range b.Len() {
				s := b.Service(i)
				if v, _ := s.Label("zonal"); v != "true" {
					continue
				}
				for j := range s.Len() {
					if e := s.Endpoint(j); e.Zone() != zone {
						e.SetWeight(0)
					}
				}
			}
			return nil
		},
	}
}

func services() []*plan.Service {
	a := Service("shop", "cart", "10.96.0.5", 80,
		Endpoint("10.1.0.1", 8080, "n1", "z1", "cart-1"),
		Endpoint("10.1.0.2", 8080, "n2", "z2", "cart-2"))
	a.Labels = map[string]string{"zonal": "true"}
	b := Service("shop", "db", "10.96.0.6", 5432, Endpoint("10.1.0.3", 5432, "n2", "z2", "db-0"))
	return []*plan.Service{a, b}
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		config string
		keep   string // the zone whose endpoint keeps weight 1
	}{
		{"", "z1"},
		{"null", "z1"},
		{`{"zone":"z2"}`, "z2"},
	} {
		in := services()
		out, err := Run(zonePlugin(), tc.config, plan.Node{Name: "n1", Zone: "z1"}, in...)
		if err != nil {
			t.Fatalf("config %q: %v", tc.config, err)
		}
		if out[1] != in[1] {
			t.Errorf("config %q: the unlabelled service is not returned as itself", tc.config)
		}
		for _, e := range out[0].Endpoints {
			want := uint32(0)
			if e.Zone == tc.keep {
				want = 1
			}
			if e.Weight != want {
				t.Errorf("config %q: endpoint %s weight %d, want %d", tc.config, e.Address, e.Weight, want)
			}
		}
		if in[0].Endpoints[1].Weight != 1 {
			t.Error("Run modified its input")
		}
	}
}

func TestRunFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plugin guest.Plugin
		config string
		want   []string
	}{
		{"bad config", zonePlugin(), `{"zones":"z2"}`, []string{"configure returned status BadConfig", `unknown field "zones"`}},
		{"config without a callback", guest.Plugin{}, `{}`, []string{"BadConfig", "takes no configuration"}},
		{"handler error", guest.Plugin{Process: func(*abi.Batch) error { return errors.New("no zone label") }}, "",
			[]string{"process returned status Failed", "plugin stderr: no zone label"}},
		{"panic", guest.Plugin{Process: func(b *abi.Batch) error { b.Service(7); return nil }}, "",
			[]string{"process returned status Panic", "service index 7 out of range"}},
		{"forbidden change", guest.Plugin{Process: func(b *abi.Batch) error {
			// Point endpoint 0 of the first service at another address.
			addr := b.Service(0).Endpoint(0).Address().As16()
			raw := b.Bytes()
			raw[bytes.Index(raw, addr[:])+15] = 99
			return nil
		}}, "", []string{"output rejected", "service 0 (shop/cart:/TCP): endpoint 0: address 10.1.0.99"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Run(tc.plugin, tc.config, plan.Node{Name: "n1"}, services()...)
			if err == nil {
				t.Fatalf("got %v, want an error", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestHelpers(t *testing.T) {
	e := Endpoint("fd00::1", 443, "n", "z", "p")
	want := plan.Endpoint{Address: netip.MustParseAddr("fd00::1"), Port: 443, NodeName: "n", Zone: "z", Pod: "p",
		Ready: true, Serving: true, ForCluster: true, Weight: 1}
	if e != want {
		t.Errorf("Endpoint = %+v, want %+v", e, want)
	}
	s := Service("ns", "name", "10.0.0.1", 8080, e)
	if s.Key != (plan.Key{Namespace: "ns", Name: "name", Protocol: plan.TCP}) || s.Port != 8080 ||
		len(s.ClusterIPs) != 1 || s.ClusterIPs[0] != netip.MustParseAddr("10.0.0.1") || len(s.Endpoints) != 1 {
		t.Errorf("Service = %+v", s)
	}
}
