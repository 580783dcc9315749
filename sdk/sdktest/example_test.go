package sdktest_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

func ExampleRun() {
	// A plugin that drains (weight 0) the endpoints on the nodes a Service
	// annotation lists; in a plugin's main package this is the value init
	// registers, and its test runs the same value.
	drain := guest.Plugin{Process: func(b *abi.Batch) error {
		for i := range b.Len() {
			s := b.Service(i)
			nodes, ok := s.Annotation("drain.example.com/nodes")
			if !ok {
				continue
			}
			for j := range s.Len() {
				if e := s.Endpoint(j); strings.Contains(","+nodes+",", ","+e.NodeName()+",") {
					e.SetWeight(0)
				}
			}
		}
		return nil
	}}

	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"),
		sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-2"))
	web.Annotations = map[string]string{"drain.example.com/nodes": "node-b1"}
	db := sdktest.Service("shop", "db", "10.96.0.11", 5432,
		sdktest.Endpoint("10.244.2.3", 5432, "node-b1", "zone-b", "db-0"))

	out, err := sdktest.Run(drain, "", plan.Node{Name: "node-a1", Zone: "zone-a"}, web, db)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(out[0])
	// A service the plugin left alone comes back as the very same pointer.
	fmt.Println("db unchanged:", out[1] == db)
	// Output:
	// service shop/web:/TCP
	//   clusterIP 10.96.0.10 port 80
	//   endpoint 10.244.1.5:8080 weight=1 node=node-a1 zone=zone-a pod=web-1 ready serving local
	//   endpoint 10.244.2.7:8080 weight=0 node=node-b1 zone=zone-b pod=web-2 ready serving
	// db unchanged: true
}

func ExampleRun_failure() {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"))
	node := plan.Node{Name: "node-a1"}

	// The error names the status Weir would get and what the plugin wrote
	// to stderr: here a configuration the plugin takes none of, ...
	_, err := sdktest.Run(guest.Plugin{}, `{"weight": 10}`, node, web)
	fmt.Println(err)

	// ... and a Process error, which fails the whole batch.
	failing := guest.Plugin{Process: func(b *abi.Batch) error {
		if b.NodeZone() == "" {
			return errors.New("zone preference: node " + b.NodeName() + " has no zone")
		}
		return nil
	}}
	_, err = sdktest.Run(failing, "", node, web)
	fmt.Println(err)
	// Output:
	// sdktest: configure returned status BadConfig; plugin stderr: config: this plugin takes no configuration
	// sdktest: process returned status Failed; plugin stderr: zone preference: node node-a1 has no zone
}

func ExampleService() {
	// A single-port ClusterIP service, ready to give more fields.
	s := sdktest.Service("shop", "cart", "10.96.0.20", 80,
		sdktest.Endpoint("10.244.1.9", 8080, "node-a1", "zone-a", "cart-0"),
		sdktest.Endpoint("fd00:10:244::9", 8080, "node-b1", "zone-b", "cart-1"))
	s.NodePort = 30080
	s.Annotations = map[string]string{"affinity.example.com/timeout": "600"}
	fmt.Print(s)
	// Output:
	// service shop/cart:/TCP
	//   clusterIP 10.96.0.20 port 80
	//   nodePort 30080
	//   endpoint 10.244.1.9:8080 weight=1 node=node-a1 zone=zone-a pod=cart-0 ready serving
	//   endpoint [fd00:10:244::9]:8080 weight=1 node=node-b1 zone=zone-b pod=cart-1 ready serving
}

func ExampleEndpoint() {
	// A ready endpoint for cluster traffic; change the flags for the
	// cases a plugin must handle, such as a pod that is shutting down.
	e := sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-2")
	fmt.Println(e)
	e.Ready, e.Terminating, e.ForCluster = false, true, false
	fmt.Println(e)
	// Output:
	// endpoint 10.244.2.7:8080 weight=1 node=node-b1 zone=zone-b pod=web-2 ready serving
	// endpoint 10.244.2.7:8080 weight=1 node=node-b1 zone=zone-b pod=web-2 serving terminating not-for-cluster
}
