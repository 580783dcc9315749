package planner

import (
	"fmt"
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

// candidate is an endpoint with the topology hints of its slice entry.
type candidate struct {
	plan.Endpoint
	forZones, forNodes []string
}

// endpoints collects the endpoints of one service port from its slices and
// marks which traffic each serves (kube-proxy's endpoint categorisation):
//
//   - Cluster policy: the ready endpoints (narrowed by topology hints when
//     they can be used), or, when none is ready, the serving terminating ones.
//   - Local policy: this node's ready endpoints, or, when it has none, this
//     node's serving terminating ones.
//
// Each set is only computed when one of the service's policies uses it,
// and for each IP family on its own.
// Endpoints in neither set stay in the plan when they are ready or serving
// terminating somewhere: a backend then knows the service has endpoints, just
// none for this traffic (kube-proxy drops such traffic instead of rejecting
// it). Other endpoints are left out.
func endpoints(cfg Config, svc *plan.Service, sl []*source.EndpointSlice) ([]plan.Endpoint, []Problem) {
	all, problems := collect(cfg, svc.Key, sl)
	// Like kube-proxy, whose proxier is per IP family, each family is
	// categorised on its own: IPv6 endpoints that are only terminating
	// still serve IPv6 traffic when the IPv4 ones are ready. collect sorts
	// IPv4 before IPv6.
	split := slices.IndexFunc(all, func(c candidate) bool { return c.Address.Is6() })
	if split < 0 {
		split = len(all)
	}
	for _, fam := range [][]candidate{all[:split], all[split:]} {
		if usesClusterEndpoints(svc) {
			markCluster(cfg, fam)
		}
		if usesLocalEndpoints(svc) {
			markLocal(fam)
		}
	}
	// The plan keeps its endpoints for as long as the service does: in an
	// array of exactly their number.
	keep := func(c candidate) bool { return c.ForCluster || c.ForLocal || c.Ready || (c.Serving && c.Terminating) }
	n := 0
	for _, c := range all {
		if keep(c) {
			n++
		}
	}
	if n == 0 {
		return nil, problems
	}
	out := make([]plan.Endpoint, 0, n)
	for _, c := range all {
		if keep(c) {
			out = append(out, c.Endpoint)
		}
	}
	return out, problems
}

func externallyAccessible(svc *plan.Service) bool {
	return svc.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
}

// usesClusterEndpoints reports whether any traffic is balanced over the
// whole cluster: internal traffic with internalTrafficPolicy Cluster, and
// external traffic, which with externalTrafficPolicy Local still needs the
// cluster endpoints for what the node and its pods send to the external
// addresses (the short circuit), as in kube-proxy (UsesClusterEndpoints).
func usesClusterEndpoints(svc *plan.Service) bool {
	return !svc.InternalLocal || externallyAccessible(svc)
}

// usesLocalEndpoints reports whether internal or external traffic stays on
// this node.
func usesLocalEndpoints(svc *plan.Service) bool {
	return svc.InternalLocal || (externallyAccessible(svc) && svc.ExternalLocal)
}

func markCluster(cfg Config, all []candidate) {
	topo := topology(cfg, all)
	found := false
	for i := range all {
		if all[i].Ready && topo.allows(all[i]) {
			all[i].ForCluster, found = true, true
		}
	}
	if found {
		return
	}
	for i := range all {
		all[i].ForCluster = all[i].Serving && all[i].Terminating
	}
}

func markLocal(all []candidate) {
	ready := slices.ContainsFunc(all, func(c candidate) bool { return c.Local && c.Ready })
	for i := range all {
		c := &all[i]
		if ready {
			c.ForLocal = c.Local && c.Ready
		} else {
			c.ForLocal = c.Local && c.Serving && c.Terminating
		}
	}
}

// collect returns every endpoint of the port across slices, each address and
// port once, sorted by address and port. When two slices list the same one
// (an endpoint moving between slices, or a pod IP reused while the old pod
// terminates), a copy that is not terminating wins over one that is,
// whichever slice comes first, as in kube-proxy (addEndpoints).
func collect(cfg Config, key plan.Key, sl []*source.EndpointSlice) ([]candidate, []Problem) {
	n := 0
	for _, s := range sl {
		n += len(s.Endpoints)
	}
	out := make([]candidate, 0, n)
	var problems []Problem
	seen := make(map[netip.AddrPort]int, n) // index in out
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
		for i := range s.Endpoints {
			c, problem := endpoint(cfg, obj, i, &s.Endpoints[i], uint16(port), s.AddressType)
			if problem != nil {
				problems = append(problems, *problem)
				continue
			}
			if i, dup := seen[c.AddrPort()]; !dup {
				seen[c.AddrPort()] = len(out)
				out = append(out, c)
			} else if !c.Terminating {
				out[i] = c
			}
		}
	}
	slices.SortFunc(out, func(a, b candidate) int { return a.AddrPort().Compare(b.AddrPort()) })
	return out, problems
}

// slicePort finds the slice's port for the service port: same name, same
// protocol (the record holds TCP for a port that names none).
func slicePort(s *source.EndpointSlice, key plan.Key) (int32, bool) {
	for _, p := range s.Ports {
		if p.Name == key.Port && plan.Protocol(p.Protocol) == key.Protocol && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// endpoint returns the candidate of endpoint i of a slice; the record holds
// the API's defaults for missing conditions.
func endpoint(cfg Config, obj string, i int, e *source.Endpoint, port uint16, family discoveryv1.AddressType) (candidate, *Problem) {
	field := fmt.Sprintf("endpoints[%d].addresses", i)
	if e.NoAddress {
		return candidate{}, &Problem{obj, field, "no address"}
	}
	addr, err := netip.ParseAddr(e.Address)
	if err != nil {
		return candidate{}, &Problem{obj, field + "[0]", fmt.Sprintf("%q is not an IP address", e.Address)}
	}
	addr = addr.Unmap()
	if addr.Is4() != (family == discoveryv1.AddressTypeIPv4) {
		return candidate{}, &Problem{obj, field + "[0]", fmt.Sprintf("%s is not an %s address", addr, family)}
	}
	c := candidate{Endpoint: plan.Endpoint{
		Address:     addr,
		Port:        port,
		NodeName:    e.NodeName,
		Zone:        e.Zone,
		Pod:         e.Pod,
		Local:       e.NodeName != "" && e.NodeName == cfg.NodeName,
		Ready:       e.Ready,
		Serving:     e.Serving,
		Terminating: e.Terminating,
		Weight:      1,
	}}
	if e.Hints != nil {
		c.forZones, c.forNodes = e.Hints.ForZones, e.Hints.ForNodes
	}
	return c, nil
}
