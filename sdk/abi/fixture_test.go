package abi

import (
	"net/netip"
	"strconv"

	"github.com/weirproxy/weir/sdk/plan"
)

var testNode = plan.Node{Name: "node-a", Zone: "zone-1"}

func ep(addr string, port uint16, node, zone, pod string, weight uint32) plan.Endpoint {
	return plan.Endpoint{
		Address: netip.MustParseAddr(addr), Port: port, NodeName: node, Zone: zone, Pod: pod,
		Ready: true, Serving: true, ForCluster: true, ForLocal: node == testNode.Name,
		Local: node == testNode.Name, Weight: weight,
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// simple is a one-IP TCP service with endpoints 10.1.0.1.. on port 8080.
func simple(ns, name string, endpoints int) *plan.Service {
	s := &plan.Service{
		Key:        plan.Key{Namespace: ns, Name: name, Port: "http", Protocol: plan.TCP},
		ClusterIPs: addrs("10.96.0.10"),
		Port:       80,
	}
	for i := range endpoints {
		s.Endpoints = append(s.Endpoints, ep("10.1.0."+strconv.Itoa(i+1), 8080, "node-"+strconv.Itoa(i%3),
			"zone-"+strconv.Itoa(i%2), name+"-pod-"+strconv.Itoa(i), 1))
	}
	return s
}

// rich is a dual-stack service using every field of plan.Service.
func rich() *plan.Service {
	return &plan.Service{
		Key:                 plan.Key{Namespace: "prod", Name: "web", Port: "https", Protocol: plan.TCP},
		ClusterIPs:          addrs("10.96.0.20", "fd00::20"),
		Port:                443,
		NodePort:            30443,
		ExternalIPs:         addrs("192.0.2.7", "2001:db8::7"),
		LoadBalancerIPs:     addrs("198.51.100.9", "2001:db8:1::9"),
		SourceRanges:        []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:2::/48"), netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
		ExternalLocal:       true,
		InternalLocal:       true,
		HealthCheckNodePort: 31000,
		Affinity:            &plan.Affinity{TimeoutSeconds: 10800},
		Scheduler:           plan.SchedulerMaglevHash,
		Labels:              map[string]string{"app": "web", "tier": "front", "": "empty-key", "z": ""},
		Annotations:         map[string]string{"weir.io/weight": "zone", "b": "2", "a": "1"},
		Endpoints: []plan.Endpoint{
			ep("10.1.0.1", 8443, "node-a", "zone-1", "web-1", 1),
			ep("fd00:1::1", 8443, "node-b", "zone-2", "web-1", 7),
			{Address: netip.MustParseAddr("10.1.0.3"), Port: 8443, Terminating: true, Serving: true, Weight: 0},
			{Address: netip.MustParseAddr("10.1.0.4"), Port: 8443, Ready: true, Serving: true, Terminating: true,
				Local: true, ForCluster: true, ForLocal: true, Weight: 0xffffffff, NodeName: "node-a", Zone: "", Pod: ""},
		},
	}
}
