package plan_test

import (
	"fmt"
	"net/netip"

	"github.com/weirproxy/weir/sdk/plan"
)

func ExampleKey_String() {
	// A single-port Service has an unnamed port: the name between ':' and
	// '/' is empty.
	k := plan.Key{Namespace: "kube-system", Name: "dns", Protocol: plan.UDP}
	fmt.Println(k)
	k.Port, k.Protocol = "dns-tcp", plan.TCP
	fmt.Println(k)
	// Output:
	// kube-system/dns:/UDP
	// kube-system/dns:dns-tcp/TCP
}

func ExamplePlan_String() {
	web := &plan.Service{
		Key:        plan.Key{Namespace: "shop", Name: "web", Port: "http", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:       80,
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("10.244.1.5"), Port: 8080, NodeName: "node-a1", Zone: "zone-a",
				Ready: true, Serving: true, Local: true, ForCluster: true, ForLocal: true, Weight: 1},
			{Address: netip.MustParseAddr("10.244.2.7"), Port: 8080, NodeName: "node-b1", Zone: "zone-b",
				Serving: true, Terminating: true, Weight: 1},
		},
	}
	p := &plan.Plan{
		Node:         plan.Node{Name: "node-a1", Zone: "zone-a", Addresses: []netip.Addr{netip.MustParseAddr("172.30.0.11")}},
		Services:     map[plan.Key]*plan.Service{web.Key: web},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	}
	fmt.Print(p)
	// Output:
	// node node-a1 zone=zone-a address=172.30.0.11
	// serviceCIDRs 10.96.0.0/16
	// service shop/web:http/TCP
	//   clusterIP 10.96.0.10 port 80
	//   endpoint 10.244.1.5:8080 weight=1 node=node-a1 zone=zone-a ready serving local for-local
	//   endpoint 10.244.2.7:8080 weight=1 node=node-b1 zone=zone-b serving terminating not-for-cluster
}

func ExamplePlan_Keys() {
	p := &plan.Plan{Services: map[plan.Key]*plan.Service{}}
	for _, k := range []plan.Key{
		{Namespace: "shop", Name: "web", Port: "http", Protocol: plan.TCP},
		{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: plan.UDP},
		{Namespace: "kube-system", Name: "dns", Port: "dns-tcp", Protocol: plan.TCP},
	} {
		p.Services[k] = &plan.Service{Key: k}
	}
	// Map order is random; Keys is sorted.
	for _, k := range p.Keys() {
		fmt.Println(k)
	}
	// Output:
	// kube-system/dns:dns/UDP
	// kube-system/dns:dns-tcp/TCP
	// shop/web:http/TCP
}

func ExampleService_String() {
	cart := &plan.Service{
		Key:        plan.Key{Namespace: "shop", Name: "cart", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
		Port:       80,
		Affinity:   &plan.Affinity{TimeoutSeconds: 600},
		Scheduler:  plan.SchedulerSourceHash,
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("10.244.1.9"), Port: 8080, Pod: "cart-0", Ready: true, Serving: true, ForCluster: true, Weight: 1},
			{Address: netip.MustParseAddr("10.244.2.4"), Port: 8080, Pod: "cart-1", Ready: true, Serving: true, ForCluster: true, Weight: 0},
		},
	}
	fmt.Print(cart)
	// Output:
	// service shop/cart:/TCP
	//   clusterIP 10.96.0.20 port 80
	//   affinity=ClientIP/600s scheduler=sh
	//   endpoint 10.244.1.9:8080 weight=1 pod=cart-0 ready serving
	//   endpoint 10.244.2.4:8080 weight=0 pod=cart-1 ready serving
}

func ExampleService_Clone() {
	orig := &plan.Service{
		Key: plan.Key{Namespace: "shop", Name: "web", Protocol: plan.TCP},
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("10.244.1.5"), Port: 8080, Pod: "web-7d9f-x2k4p", Weight: 1},
			{Address: netip.MustParseAddr("10.244.2.9"), Port: 8080, Pod: "web-canary-0", Weight: 1},
		},
	}
	// Give the canary a tenth of the new connections on a copy: the
	// original and its endpoint slice stay as they were.
	canary := orig.Clone()
	canary.Endpoints[0].Weight = 9
	fmt.Println(orig.Endpoints[0].Weight, orig.Endpoints[1].Weight)
	fmt.Println(canary.Endpoints[0].Weight, canary.Endpoints[1].Weight)
	fmt.Println(orig.Equal(canary))
	// Output:
	// 1 1
	// 9 1
	// false
}

func ExampleService_SameRules() {
	a := &plan.Service{
		Key: plan.Key{Namespace: "shop", Name: "web", Protocol: plan.TCP},
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("10.244.1.5"), Port: 8080, NodeName: "node-a1", Weight: 1},
			{Address: netip.MustParseAddr("10.244.2.7"), Port: 8080, NodeName: "node-b1", Weight: 1},
		},
	}

	// An annotation is input to hook plugins but no rule by itself.
	b := a.Clone()
	b.Annotations = map[string]string{"zone-preference.weir.dev/disabled": "true"}
	fmt.Println(a.Equal(b), a.SameRules(b))

	// A drained endpoint is a different rule.
	c := a.Clone()
	c.Endpoints[1].Weight = 0
	fmt.Println(a.Equal(c), a.SameRules(c))
	// Output:
	// false true
	// false false
}
