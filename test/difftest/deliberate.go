package difftest

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// deliberate names the deliberate difference of Weir's (docs/semantics.md)
// that explains why Weir's outcome of p differs from kube-proxy's, or
// returns "". Each check recomputes both proxies' documented behaviour
// from the scenario and holds only when each proxy did exactly that, so a
// deliberate difference cannot hide another one.
func deliberate(sc *Scenario, p Probe, kp, weir Outcome) string {
	if p.Proto == "HTTP" && healthCounts(sc, p, kp, weir) {
		return "health checks count the endpoints that serve the Service's ports, not every address of its slices"
	}
	return ""
}

// healthCounts reports whether a health check's answers are kube-proxy's
// count (the distinct ready addresses on this node over every port of
// every slice of the Service, whether or not a port of the Service
// resolves to it: its LocalReadyEndpoints) and Weir's (the same over the
// slice ports that resolve to a port of the Service), and these differ.
func healthCounts(sc *Scenario, p Probe, kp, weir Outcome) bool {
	name := strings.TrimSuffix(p.Service, " health")
	i := slices.IndexFunc(sc.Services, func(s *corev1.Service) bool { return s.Name == name })
	if i < 0 {
		return false
	}
	svc := sc.Services[i]
	all, resolved := localReady(sc.slicesOf(name), nil), localReady(sc.slicesOf(name), svc)
	return all != resolved && kp.Health == healthAnswer(all) && weir.Health == healthAnswer(resolved) &&
		len(kp.Fails) == 0 && len(weir.Fails) == 0
}

// localReady counts the distinct ready addresses on this node in slices
// kube-proxy reads (IPv4, not labelled headless), over every slice port,
// or with svc over the slice ports that match one of svc's ports by name
// and protocol.
func localReady(list []*discoveryv1.EndpointSlice, svc *corev1.Service) int {
	seen := map[string]bool{}
	for _, sl := range list {
		if _, headless := sl.Labels[corev1.IsHeadlessService]; headless || !slicePortsMatch(sl, svc) {
			continue
		}
		for _, ep := range sl.Endpoints {
			local := ep.NodeName != nil && *ep.NodeName == NodeName
			if local && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				for _, a := range ep.Addresses {
					seen[a] = true
				}
			}
		}
	}
	return len(seen)
}

// slicePortsMatch reports whether the slice has a port kube-proxy reads
// (with a number) that, when svc is given, is one of svc's ports.
func slicePortsMatch(sl *discoveryv1.EndpointSlice, svc *corev1.Service) bool {
	for _, sp := range sl.Ports {
		if sp.Port == nil {
			continue
		}
		if svc == nil {
			return true
		}
		for _, p := range svc.Spec.Ports {
			if sp.Name != nil && *sp.Name == p.Name && sp.Protocol != nil && *sp.Protocol == p.Protocol {
				return true
			}
		}
	}
	return false
}

// healthAnswer is the health check's answer for a count of local
// endpoints.
func healthAnswer(n int) string {
	if n == 0 {
		return "503 localEndpoints=0"
	}
	return fmt.Sprintf("200 localEndpoints=%d", n)
}
