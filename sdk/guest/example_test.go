package guest_test

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// This example only compiles: Register belongs in the init function of a
// plugin's main package, built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o drain.wasm .
//
// whose main function is empty (Weir calls the WebAssembly exports, which
// call the registered callbacks).
func ExampleRegister() {
	// The configuration in force, kept in a package variable in a real
	// plugin: Weir configures every new instance before its first batch.
	var cfg struct {
		Annotation string `json:"annotation"`
	}

	guest.Register(guest.Plugin{
		Configure: func(raw []byte) error {
			cfg.Annotation = "drain.example.com/pods" // the default
			if err := guest.DecodeConfig(raw, &cfg); err != nil {
				return err
			}
			if cfg.Annotation == "" {
				return errors.New("annotation: must not be empty")
			}
			return nil
		},
		// Drop the endpoints of the pods a Service annotation lists.
		Process: func(b *abi.Batch) error {
			for i := range b.Len() {
				s := b.Service(i)
				pods, ok := s.Annotation(cfg.Annotation)
				if !ok {
					continue
				}
				drained := strings.Split(pods, ",")
				s.Keep(func(e abi.Endpoint) bool {
					pod := e.Pod()
					for _, d := range drained {
						if pod == d {
							return false
						}
					}
					return true
				})
			}
			return nil
		},
	})
}

func ExampleDecodeConfig() {
	type config struct {
		MinEndpoints int    `json:"minEndpoints"`
		Mode         string `json:"mode"`
	}
	for _, raw := range []string{
		`null`, // no config entry: the defaults stay
		`{"minEndpoints": 3}`,
		`{"minEndpoint": 3}`, // a typo is an error, not a silent default
		`{"mode": "drop"} {"mode": "weight"}`,
	} {
		c := config{MinEndpoints: 2, Mode: "drop"} // defaults first
		if err := guest.DecodeConfig([]byte(raw), &c); err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%+v\n", c)
	}
	// Output:
	// {MinEndpoints:2 Mode:drop}
	// {MinEndpoints:3 Mode:drop}
	// config: json: unknown field "minEndpoint"
	// config: unexpected data after the JSON value
}

func ExampleConfigure() {
	// A plugin without a Configure callback accepts no configuration.
	noConfig := guest.Plugin{}
	fmt.Println(guest.Configure(noConfig, []byte("null"), os.Stdout))
	fmt.Println(guest.Configure(noConfig, []byte(`{"weight": 10}`), os.Stdout))

	// A Configure error refuses the configuration: Weir does not load the
	// plugin and logs the reason the plugin wrote to stderr.
	strict := guest.Plugin{Configure: func(raw []byte) error {
		var c struct {
			Weight uint32 `json:"weight"`
		}
		if err := guest.DecodeConfig(raw, &c); err != nil {
			return err
		}
		if c.Weight > 100 {
			return errors.New("weight: at most 100")
		}
		return nil
	}}
	fmt.Println(guest.Configure(strict, []byte(`{"weight": 10}`), os.Stdout))
	fmt.Println(guest.Configure(strict, []byte(`{"weight": 1000}`), os.Stdout))
	// Output:
	// OK
	// config: this plugin takes no configuration
	// BadConfig
	// OK
	// weight: at most 100
	// BadConfig
}

func ExampleProcess() {
	var weir abi.Encoder
	batch := weir.Encode(plan.Node{Name: "node-a1", Zone: "zone-a"}, []*plan.Service{
		sdktest.Service("shop", "web", "10.96.0.10", 80,
			sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"),
			sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-2")),
	}, true)

	// Prefer this node's zone: weight its endpoints up tenfold.
	zonal := guest.Plugin{Process: func(b *abi.Batch) error {
		if b.NodeZone() == "" {
			return errors.New("the node has no zone")
		}
		for i := range b.Len() {
			s := b.Service(i)
			for j := range s.Len() {
				if e := s.Endpoint(j); e.Zone() == b.NodeZone() {
					e.SetWeight(10 * e.Weight())
				}
			}
		}
		return nil
	}}
	out, status := guest.Process(zonal, batch, os.Stdout)
	fmt.Println(status)
	_, services, _, _ := abi.DecodeBatch(out)
	for _, e := range services[0].Endpoints {
		fmt.Println(e.Zone, e.Weight)
	}

	// An error or a panic fails the whole batch; the reason goes to stderr.
	broken := guest.Plugin{Process: func(b *abi.Batch) error {
		b.Service(0).Endpoint(2).SetWeight(0) // there are two endpoints
		return nil
	}}
	// A panic's reason says where it happened: here in the SDK's accessor,
	// called from the plugin's line that passed the bad index.
	var stderr strings.Builder
	_, status = guest.Process(broken, batch, &stderr)
	reason, site, _ := strings.Cut(stderr.String(), " (at ")
	_, caller, _ := strings.Cut(site, ", called from ")
	fmt.Println(status)
	fmt.Println(reason)
	fmt.Println(strings.Contains(caller, "example_test.go:"))
	// Output:
	// OK
	// zone-a 10
	// zone-b 1
	// Panic
	// panic: abi: endpoint index 2 out of range [0,2)
	// true
}
