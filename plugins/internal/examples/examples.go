// Package examples holds what the example plugins' tests share: a native
// benchmark on a full sync of 10k services with 10 endpoints each (2 canary
// pods, nodes in 3 zones and 2 pools), annotated for every example plugin,
// and the check of each plugin's example config.
package examples

import (
	"encoding/json"
	"io"
	"os"
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// Process configures p with config (JSON) and runs it b.N times on a fresh
// copy of the 10k batch, through the same path as the wasm export.
func Process(b *testing.B, p guest.Plugin, config string) {
	var enc abi.Encoder
	run(b, p, config, enc.Encode(plan.Node{Name: "pool-0-1", Zone: "zone-0"}, services(), true))
}

// ProcessSignals is Process on a version 2 batch of the 10k services in
// which endpoint j of service i has the signals sig(i, j).
func ProcessSignals(b *testing.B, p guest.Plugin, config string, sig func(i, j int) abi.Signals) {
	svcs := services()
	signals := make([][]abi.Signals, len(svcs))
	for i, s := range svcs {
		signals[i] = make([]abi.Signals, len(s.Endpoints))
		for j := range signals[i] {
			signals[i][j] = sig(i, j)
		}
	}
	var enc abi.Encoder
	run(b, p, config, enc.EncodeSignals(plan.Node{Name: "pool-0-1", Zone: "zone-0"}, svcs, true, signals))
}

// run configures p with config and runs it b.N times on a fresh copy of in.
func run(b *testing.B, p guest.Plugin, config string, in []byte) {
	b.Helper()
	if st := guest.Configure(p, []byte(config), io.Discard); st != abi.StatusOK {
		b.Fatal(st)
	}
	buf := make([]byte, len(in))
	b.ResetTimer()
	for range b.N {
		copy(buf, in)
		if _, st := guest.Process(p, buf, io.Discard); st != abi.StatusOK {
			b.Fatal(st)
		}
	}
}

// services returns the 10k services.
func services() []*plan.Service {
	var svcs []*plan.Service
	for i := range 10000 {
		var eps []plan.Endpoint
		for j := range 10 {
			pod := "web-" + strconv.Itoa(j)
			if j < 2 {
				pod = "web-canary-" + strconv.Itoa(j)
			}
			addr := "10." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + "." + strconv.Itoa(j+1)
			node := "pool-" + strconv.Itoa(j%2) + "-" + strconv.Itoa((i+j)%50)
			eps = append(eps, sdktest.Endpoint(addr, 8080, node, "zone-"+strconv.Itoa(j%3), pod))
		}
		s := sdktest.Service("ns", "svc-"+strconv.Itoa(i), "10.96."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250), 80, eps...)
		s.Annotations = map[string]string{"canary.weir.dev/split": "web-canary=10", "affinity.weir.dev/client-ip": "30m"}
		svcs = append(svcs, s)
	}
	return svcs
}

// ExampleConfig checks that p accepts the config of the one entry in the
// config.yaml of the current directory (the plugin's folder).
func ExampleConfig(t *testing.T, p guest.Plugin, node plan.Node) {
	t.Helper()
	data, err := os.ReadFile("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Plugins []struct {
			Config json.RawMessage `json:"config"`
		} `json:"plugins"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil || len(file.Plugins) != 1 {
		t.Fatalf("config.yaml: %v, %d entries", err, len(file.Plugins))
	}
	if _, err := sdktest.Run(p, string(file.Plugins[0].Config), node); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
}
