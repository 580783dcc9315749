// Package benchkit holds what the backends' scale benchmarks share: a plan
// of many services (test/netns.Empty gives them a namespace to program).
package benchkit

import (
	"fmt"
	"net/netip"

	"github.com/weirproxy/weir/sdk/plan"
)

// maxNodePorts caps the node ports of a Plan, keeping them inside
// Kubernetes's default range 30000-32767.
const maxNodePorts = 2700

// Plan returns n TCP services bench/svc-0, bench/svc-1, ... on port 80, with
// eps ready endpoints each on port 8080. Every nodePortEvery-th service, up
// to 2700 of them, has a node port, numbered from 30000; with nodePortEvery
// 0 none has.
func Plan(n, eps, nodePortEvery int) *plan.Plan {
	p := &plan.Plan{Services: make(map[plan.Key]*plan.Service, n)}
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
		}
		if nodePortEvery > 0 && i%nodePortEvery == 0 && i/nodePortEvery < maxNodePorts {
			s.NodePort = uint16(30000 + i/nodePortEvery)
		}
		for j := range eps {
			s.Endpoints = append(s.Endpoints, plan.Endpoint{
				Address: netip.AddrFrom4([4]byte{10, 128 + byte(i>>12), byte(i >> 4), byte(i<<4) + byte(j)}),
				Port:    8080, Ready: true, Serving: true, ForCluster: true, Weight: 1,
			})
		}
		p.Services[s.Key] = s
	}
	return p
}

// DualStack gives every every-th service of p (from Plan) an IPv6 cluster
// IP as well, fd00:96::N, and as many IPv6 endpoints as IPv4 ones.
func DualStack(p *plan.Plan, every int) {
	for _, s := range p.Services {
		var i int
		if _, err := fmt.Sscanf(s.Key.Name, "svc-%d", &i); err != nil || i%every != 0 {
			continue
		}
		s.ClusterIPs = append(s.ClusterIPs, v6(0x96, i, 0))
		for j := range len(s.Endpoints) {
			ep := s.Endpoints[j]
			ep.Address = v6(0x128, i, j+1)
			s.Endpoints = append(s.Endpoints, ep)
		}
	}
}

// v6 returns fd00:PREFIX::I:J.
func v6(prefix uint16, i, j int) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfd, 0x00
	a[2], a[3] = byte(prefix>>8), byte(prefix)
	a[10], a[11], a[12], a[13] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
	a[14], a[15] = byte(j>>8), byte(j)
	return netip.AddrFrom16(a)
}
