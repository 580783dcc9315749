package sdktest_test

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// A zone-preference plugin, as its main package would hold it, and a run
// of it as its test would make one. The main package adds
//
//	func init() { guest.Register(zonePlugin) }
//	func main() {}

// zoneConfig is the plugin's configuration.
type zoneConfig struct {
	// MinEndpoints is how many endpoints the node's zone needs before the
	// others are dropped.
	MinEndpoints int `json:"minEndpoints"`
}

// zoneSettings is the configuration in force; each new instance is
// configured again, so a package variable is enough.
var zoneSettings = zoneConfig{MinEndpoints: 2}

var zonePlugin = guest.Plugin{Configure: configureZone, Process: preferZone}

func configureZone(raw []byte) error {
	c := zoneConfig{MinEndpoints: 2} // with no config, the defaults apply
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if c.MinEndpoints < 1 {
		return errors.New("minEndpoints: must be at least 1")
	}
	zoneSettings = c
	return nil
}

// preferZone drops the other zones' endpoints of every service that has
// enough in the node's zone.
func preferZone(b *abi.Batch) error {
	zone := b.NodeZone()
	for i := range b.Len() {
		s := b.Service(i)
		inZone := 0
		for j := range s.Len() {
			if s.Endpoint(j).Zone() == zone {
				inZone++
			}
		}
		if zone != "" && inZone >= zoneSettings.MinEndpoints {
			s.Keep(func(e abi.Endpoint) bool { return e.Zone() == zone })
		}
	}
	return nil
}

func Example_zonePreference() {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"),
		sdktest.Endpoint("10.244.1.6", 8080, "node-a2", "zone-a", "web-2"),
		sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-3"))
	node := plan.Node{Name: "node-a1", Zone: "zone-a"}

	for _, config := range []string{"", `{"minEndpoints": 3}`, `{"minEndpoints": 0}`} {
		out, err := sdktest.Run(zonePlugin, config, node, web)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("config %s: %d endpoints, unchanged %v\n", cmp.Or(config, "none"), len(out[0].Endpoints), out[0] == web)
	}
	// Output:
	// config none: 2 endpoints, unchanged false
	// config {"minEndpoints": 3}: 3 endpoints, unchanged true
	// sdktest: configure returned status BadConfig; plugin stderr: minEndpoints: must be at least 1
}
