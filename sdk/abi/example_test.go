package abi_test

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// In these examples an Encoder stands in for Weir: it builds the batch a
// plugin's Process callback receives already parsed, and Decode shows what
// Weir makes of the edits.

func ExampleParse() {
	var weir abi.Encoder
	batch := weir.Encode(plan.Node{Name: "node-a1", Zone: "zone-a"}, []*plan.Service{
		sdktest.Service("shop", "web", "10.96.0.10", 80,
			sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-7d9f-x2k4p"),
			sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-7d9f-q8z1m")),
	}, true)

	b, err := abi.Parse(batch)
	if err != nil {
		fmt.Println(err)
		return
	}
	// What a Process callback sees: the node, then every service and its
	// endpoints, read straight from the buffer.
	fmt.Println(b.NodeName(), b.NodeZone(), b.Full())
	for i := range b.Len() {
		s := b.Service(i)
		fmt.Println(s.Key(), s.ClusterIPs(), s.Port())
		for j := range s.Len() {
			e := s.Endpoint(j)
			fmt.Println(" ", e.ID(), e.AddrPort(), e.Zone(), e.Pod(), e.Weight())
		}
	}
	// Output:
	// node-a1 zone-a true
	// shop/web:/TCP [10.96.0.10] 80
	//   0 10.244.1.5:8080 zone-a web-7d9f-x2k4p 1
	//   1 10.244.2.7:8080 zone-b web-7d9f-q8z1m 1
}

func ExampleService_Keep() {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"),
		sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-2"),
		sdktest.Endpoint("10.244.2.8", 8080, "node-b2", "zone-b", "web-3"))
	web.Annotations = map[string]string{"drain.example.com/nodes": "node-b1,node-c4"}
	var weir abi.Encoder
	b, _ := abi.Parse(weir.Encode(plan.Node{Name: "node-a1"}, []*plan.Service{web}, true))

	// Drop the endpoints on the nodes a Service annotation lists.
	for i := range b.Len() {
		s := b.Service(i)
		nodes, ok := s.Annotation("drain.example.com/nodes")
		if !ok {
			continue
		}
		drained := strings.Split(nodes, ",")
		n := s.Keep(func(e abi.Endpoint) bool {
			for _, d := range drained {
				if e.NodeName() == d {
					return false
				}
			}
			return true
		})
		fmt.Println(s.Key(), "keeps", n, "endpoints")
	}

	out, _ := abi.Decode([]*plan.Service{web}, b.Bytes())
	fmt.Print(out[0])
	// Output:
	// shop/web:/TCP keeps 2 endpoints
	// service shop/web:/TCP
	//   clusterIP 10.96.0.10 port 80
	//   endpoint 10.244.1.5:8080 weight=1 node=node-a1 zone=zone-a pod=web-1 ready serving
	//   endpoint 10.244.2.8:8080 weight=1 node=node-b2 zone=zone-b pod=web-3 ready serving
}

func ExampleService_SortEndpoints() {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-1"),
		sdktest.Endpoint("10.244.3.2", 8080, "node-c1", "zone-c", "web-2"),
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-3"))
	var weir abi.Encoder
	b, _ := abi.Parse(weir.Encode(plan.Node{Name: "node-a1", Zone: "zone-a"}, []*plan.Service{web}, true))

	// Put the endpoints in this node's zone first, for a backend that
	// tries them in order; the others keep their order.
	zone := b.NodeZone()
	b.Service(0).SortEndpoints(func(x, y abi.Endpoint) bool {
		return x.Zone() == zone && y.Zone() != zone
	})

	out, _ := abi.Decode([]*plan.Service{web}, b.Bytes())
	fmt.Print(out[0])
	// Output:
	// service shop/web:/TCP
	//   clusterIP 10.96.0.10 port 80
	//   endpoint 10.244.1.5:8080 weight=1 node=node-a1 zone=zone-a pod=web-3 ready serving
	//   endpoint 10.244.2.7:8080 weight=1 node=node-b1 zone=zone-b pod=web-1 ready serving
	//   endpoint 10.244.3.2:8080 weight=1 node=node-c1 zone=zone-c pod=web-2 ready serving
}

func ExampleEndpoint_SetWeight() {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-7d9f-x2k4p"),
		sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-7d9f-q8z1m"),
		sdktest.Endpoint("10.244.2.9", 8080, "node-b2", "zone-b", "web-canary-0"))
	var weir abi.Encoder
	b, _ := abi.Parse(weir.Encode(plan.Node{Name: "node-a1"}, []*plan.Service{web}, true))

	// Send 10% of new connections to the canary pod and share the other
	// 90% between the stable ones.
	s := b.Service(0)
	canary := func(e abi.Endpoint) bool { return strings.HasPrefix(e.Pod(), "web-canary-") }
	var stable uint32
	for i := range s.Len() {
		if !canary(s.Endpoint(i)) {
			stable++
		}
	}
	for i := range s.Len() {
		if e := s.Endpoint(i); canary(e) {
			e.SetWeight(10)
		} else {
			e.SetWeight(90 / stable)
		}
	}

	out, _ := abi.Decode([]*plan.Service{web}, b.Bytes())
	for _, e := range out[0].Endpoints {
		fmt.Println(e.Pod, e.Weight)
	}
	// Output:
	// web-7d9f-x2k4p 45
	// web-7d9f-q8z1m 45
	// web-canary-0 10
}

func ExampleService_SetAffinity() {
	cart := sdktest.Service("shop", "cart", "10.96.0.20", 80, sdktest.Endpoint("10.244.1.9", 8080, "node-a1", "zone-a", "cart-0"))
	cart.Annotations = map[string]string{"affinity.example.com/timeout": "3600"}
	login := sdktest.Service("shop", "login", "10.96.0.30", 80, sdktest.Endpoint("10.244.1.3", 8080, "node-a1", "zone-a", "login-0"))
	login.Annotations = map[string]string{"affinity.example.com/timeout": "1000000"}
	var weir abi.Encoder
	b, _ := abi.Parse(weir.Encode(plan.Node{Name: "node-a1"}, []*plan.Service{cart, login}, true))

	// Turn ClientIP affinity on with the timeout an annotation gives; a
	// timeout above a day is clamped to MaxAffinitySeconds.
	for i := range b.Len() {
		s := b.Service(i)
		v, _ := s.Annotation("affinity.example.com/timeout")
		if sec, err := strconv.ParseUint(v, 10, 32); err == nil {
			s.SetAffinity(uint32(sec))
		}
		fmt.Println(s.Key(), s.AffinitySeconds())
	}
	// Output:
	// shop/cart:/TCP 3600
	// shop/login:/TCP 86400
}

func ExampleService_SetScheduler() {
	cache := sdktest.Service("shop", "cache", "10.96.0.40", 6379, sdktest.Endpoint("10.244.1.4", 6379, "node-a1", "zone-a", "cache-0"))
	var weir abi.Encoder
	b, _ := abi.Parse(weir.Encode(plan.Node{Name: "node-a1"}, []*plan.Service{cache}, true))
	s := b.Service(0)

	// Only the schedulers in plan.Schedulers are accepted.
	fmt.Println(s.SetScheduler("random"))
	fmt.Println(s.SetScheduler(plan.SchedulerMaglevHash), s.Scheduler())
	// Output:
	// abi: unknown scheduler "random"
	// <nil> mh
}

func ExampleDecode() {
	in := []*plan.Service{
		sdktest.Service("shop", "web", "10.96.0.10", 80,
			sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1"),
			sdktest.Endpoint("10.244.2.7", 8080, "node-b1", "zone-b", "web-2")),
		sdktest.Service("shop", "db", "10.96.0.11", 5432, sdktest.Endpoint("10.244.2.3", 5432, "node-b1", "zone-b", "db-0")),
	}
	var weir abi.Encoder
	batch := weir.Encode(plan.Node{Name: "node-a1"}, in, true)

	// The plugin drains web's endpoint on node-b1, in place.
	b, _ := abi.Parse(batch)
	b.Service(0).Endpoint(1).SetWeight(0)

	// Weir checks the output against what it sent: a changed service comes
	// back as a new value, one the plugin left alone as the very same
	// pointer.
	out, err := abi.Decode(in, b.Bytes())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out[0] == in[0], out[0].Endpoints[1].Weight, in[0].Endpoints[1].Weight)
	fmt.Println(out[1] == in[1])
	// Output:
	// false 0 1
	// true
}

func ExampleDecodeBatch() {
	var weir abi.Encoder
	batch := weir.Encode(plan.Node{Name: "node-a1", Zone: "zone-a"}, []*plan.Service{
		sdktest.Service("shop", "web", "10.96.0.10", 80, sdktest.Endpoint("10.244.1.5", 8080, "node-a1", "zone-a", "web-1")),
	}, false)

	// A tool that has only the bytes turns them back into plan values.
	node, services, full, err := abi.DecodeBatch(batch)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(node)
	fmt.Println("full:", full)
	for _, s := range services {
		fmt.Print(s)
	}
	// Output:
	// node node-a1 zone=zone-a
	// full: false
	// service shop/web:/TCP
	//   clusterIP 10.96.0.10 port 80
	//   endpoint 10.244.1.5:8080 weight=1 node=node-a1 zone=zone-a pod=web-1 ready serving
}
