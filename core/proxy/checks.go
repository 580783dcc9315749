package proxy

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/core/health"
)

// healthChecksOf computes, from the final plan, the health check of each
// named service: its port and, like kube-proxy's LocalReadyEndpoints, how
// many distinct addresses of ready endpoints it has on this node, over all
// its ports. A terminating endpoint does not count even while it serves
// the Local traffic as a fallback: load balancers then drain the node
// during a rollout. A nil entry means the service has no health check.
func (p *Proxy) healthChecksOf(names map[string]bool) map[string]*health.Service {
	out := make(map[string]*health.Service, len(names))
	for name := range names {
		out[name] = p.healthCheckOf(name)
	}
	return out
}

func (p *Proxy) healthCheckOf(name string) *health.Service {
	var hc *health.Service
	var local []netip.Addr
	for _, k := range p.byService[name] {
		s := p.final.Services[k]
		if s == nil || s.HealthCheckNodePort == 0 {
			continue
		}
		if hc == nil {
			hc = &health.Service{}
		}
		hc.Namespace, hc.Name, hc.Port = s.Key.Namespace, s.Key.Name, s.HealthCheckNodePort
		for _, e := range s.Endpoints {
			if e.Local && e.Ready && !slices.Contains(local, e.Address) {
				local = append(local, e.Address)
			}
		}
		hc.LocalEndpoints = len(local)
	}
	return hc
}

// foldHealthChecks stores the health checks of a committed sync.
func (p *Proxy) foldHealthChecks(checks map[string]*health.Service) {
	for name, hc := range checks {
		if hc == nil {
			delete(p.healthChecks, name)
		} else {
			p.healthChecks[name] = *hc
		}
	}
}
