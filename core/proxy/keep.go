package proxy

import (
	"context"
	"net/netip"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// keepWithoutLastGood handles the services a plugin with failurePolicy
// closed failed on before it ever succeeded on them, for which the hooks
// return nil: "closed" means they keep the rules they have. That is the
// final service this process committed, if any; after a restart it is what
// the kernel holds, adopted by reading the backend back once. Only a
// service the kernel has no rules for stays without rules.
func (p *Proxy) keepWithoutLastGood(ctx context.Context, in, out []*plan.Service) {
	var view *backends.View
	read := false
	kept, adopted, lost := 0, 0, 0
	for i, s := range in {
		if s == nil || out[i] != nil {
			continue
		}
		if cur := p.final.Services[s.Key]; cur != nil {
			out[i] = cur
			kept++
			continue
		}
		if !read {
			view, read = p.readKernel(ctx), true
		}
		if out[i] = adopt(s, view); out[i] != nil {
			adopted++
		} else {
			lost++
		}
	}
	if kept+adopted+lost > 0 {
		p.log.Warn("A plugin with failurePolicy closed failed on services it never succeeded on; keeping their rules",
			"keptFromThisRun", kept, "adoptedFromKernel", adopted, "withoutRules", lost)
	}
}

// readKernel reads the backend's rules back, or returns nil when it cannot.
func (p *Proxy) readKernel(ctx context.Context) *backends.View {
	r, ok := p.opts.Backend.(backends.Reader)
	if !ok {
		return nil
	}
	v, err := r.ReadBack(ctx)
	if err != nil {
		p.log.Error("Cannot read the kernel's rules back to keep them for a failing closed plugin", "error", err)
		return nil
	}
	return v
}

// adopt returns s as the kernel serves it: the planned service with the
// weights and affinity the kernel gives its endpoints (an endpoint the
// kernel does not send to is drained), or nil when the kernel has no rules
// for any of its destinations. Like a plugin, adoption can only re-weight
// endpoints the cluster lists, never add any.
func adopt(s *plan.Service, view *backends.View) *plan.Service {
	if view == nil {
		return nil
	}
	cluster, okC := firstForwarding(view, s, backends.DestCluster, s.ClusterIPs, s.Port)
	external, okE := firstForwarding(view, s, backends.DestExternal, append(append([]netip.Addr(nil), s.ExternalIPs...), s.LoadBalancerIPs...), s.Port)
	if !okE && s.NodePort != 0 {
		external, okE = firstForwarding(view, s, backends.DestNodePort, []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}, s.NodePort)
	}
	if !okC && !okE {
		return nil
	}
	out := s.Clone()
	out.Affinity = nil
	for _, f := range []backends.Forwarding{cluster, external} {
		if f.AffinitySeconds > 0 {
			out.Affinity = &plan.Affinity{TimeoutSeconds: f.AffinitySeconds}
		}
	}
	// An endpoint has one weight, whichever pool the kernel shows it in.
	for i := range out.Endpoints {
		e := &out.Endpoints[i]
		w, ok := cluster.Endpoints[e.AddrPort()]
		if !ok {
			w = external.Endpoints[e.AddrPort()]
		}
		e.Weight = w
	}
	return out
}

// firstForwarding returns the kernel's forwarding of the first of addrs at
// port that the view holds.
func firstForwarding(view *backends.View, s *plan.Service, kind backends.DestinationKind, addrs []netip.Addr, port uint16) (backends.Forwarding, bool) {
	for _, a := range addrs {
		f, ok := view.Destinations[backends.Destination{Kind: kind, Addr: a, Protocol: s.Key.Protocol, Port: port}]
		if ok {
			return f, true
		}
	}
	return backends.Forwarding{}, false
}
