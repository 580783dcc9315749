package sdktest

import "github.com/weirproxy/weir/sdk/plan"

// Locate sets, in place, each endpoint's Local and ForLocal flags as
// Weir's planner does for node:
//
//   - Local: the endpoint's NodeName is node.Name (not empty).
//   - ForLocal, for a service with a Local traffic policy in use
//     (InternalLocal, or ExternalLocal with a node port, external or
//     load-balancer IP): this node's ready endpoints, or, when it has none
//     in that IP family, its serving terminating ones.
//
// Services without a Local policy in use keep the ForLocal flags they have:
// Weir sets none there, and a test may set some to exercise a plugin's
// handling of both traffic sets. Run and Capture call Locate.
func Locate(node plan.Node, services ...*plan.Service) {
	for _, s := range services {
		if s == nil {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			e.Local = e.NodeName != "" && e.NodeName == node.Name
		}
		if usesLocal(s) {
			markLocal(s.Endpoints, true)
			markLocal(s.Endpoints, false)
		}
	}
}

// usesLocal reports whether some traffic of s stays on this node.
func usesLocal(s *plan.Service) bool {
	external := s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
	return s.InternalLocal || (external && s.ExternalLocal)
}

// markLocal sets ForLocal on the endpoints of one IP family (IPv4 when v4).
func markLocal(eps []plan.Endpoint, v4 bool) {
	ready := false
	for _, e := range eps {
		if e.Address.Is4() == v4 && e.Local && e.Ready {
			ready = true
		}
	}
	for i := range eps {
		e := &eps[i]
		if e.Address.Is4() != v4 {
			continue
		}
		if ready {
			e.ForLocal = e.Local && e.Ready
		} else {
			e.ForLocal = e.Local && e.Serving && e.Terminating
		}
	}
}
