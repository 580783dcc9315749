package planner

import (
	"fmt"
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/sdk/plan"
)

// endpoints collects the endpoints of one service port from its slices and
// keeps those that should receive traffic: the ready ones, or, when none is
// ready, the serving ones that are terminating (kube-proxy's fallback).
func endpoints(cfg Config, key plan.Key, slices []*discoveryv1.EndpointSlice) ([]plan.Endpoint, []Problem) {
	all, problems := collect(cfg, key, slices)
	var ready, terminating []plan.Endpoint
	for _, e := range all {
		switch {
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready, problems
	}
	return terminating, problems
}

// collect returns every endpoint of the port across slices, each address and
// port once, sorted by address and port.
func collect(cfg Config, key plan.Key, sl []*discoveryv1.EndpointSlice) ([]plan.Endpoint, []Problem) {
	var out []plan.Endpoint
	var problems []Problem
	seen := map[netip.AddrPort]bool{}
	for _, s := range sl {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port, ok := slicePort(s, key)
		if !ok {
			continue
		}
		obj := "EndpointSlice " + s.Namespace + "/" + s.Name
		if port < 1 || port > 65535 {
			problems = append(problems, Problem{obj, "ports", fmt.Sprintf("port %q is %d, out of range 1-65535", key.Port, port)})
			continue
		}
		for i, e := range s.Endpoints {
			ep, problem := endpoint(cfg, obj, i, e, uint16(port), s.AddressType)
			if problem != nil {
				problems = append(problems, *problem)
				continue
			}
			if !seen[ep.AddrPort()] {
				seen[ep.AddrPort()] = true
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, func(a, b plan.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	return out, problems
}

// slicePort finds the slice's port for the service port: same name, same protocol.
func slicePort(s *discoveryv1.EndpointSlice, key plan.Key) (int32, bool) {
	for _, p := range s.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := plan.TCP
		if p.Protocol != nil {
			proto = plan.Protocol(*p.Protocol)
		}
		if name == key.Port && proto == key.Protocol && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

func endpoint(cfg Config, obj string, i int, e discoveryv1.Endpoint, port uint16, family discoveryv1.AddressType) (plan.Endpoint, *Problem) {
	field := fmt.Sprintf("endpoints[%d].addresses", i)
	if len(e.Addresses) == 0 {
		return plan.Endpoint{}, &Problem{obj, field, "no address"}
	}
	addr, err := netip.ParseAddr(e.Addresses[0])
	if err != nil {
		return plan.Endpoint{}, &Problem{obj, field + "[0]", fmt.Sprintf("%q is not an IP address", e.Addresses[0])}
	}
	addr = addr.Unmap()
	if addr.Is4() != (family == discoveryv1.AddressTypeIPv4) {
		return plan.Endpoint{}, &Problem{obj, field + "[0]", fmt.Sprintf("%s is not an %s address", addr, family)}
	}
	// The API reads a missing ready or serving condition as true, as kube-proxy does.
	ep := plan.Endpoint{
		Address:     addr,
		Port:        port,
		Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
		Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
		Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		Weight:      1,
	}
	if e.NodeName != nil {
		ep.NodeName = *e.NodeName
		ep.Local = ep.NodeName == cfg.NodeName
	}
	if e.Zone != nil {
		ep.Zone = *e.Zone
	}
	return ep, nil
}
