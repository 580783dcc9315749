package proxy

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// noLocal flags a service port for kube-proxy's
// sync_proxy_rules_no_local_endpoints_total: in an IP family where the port
// has a cluster IP and endpoints, its internal (cluster IP) or external
// traffic policy is Local and no endpoint serves that traffic on this node,
// so the kernel drops it. Each bit is one series of noLocalSeries.
type noLocal uint8

// noLocalFlags is the number of noLocal bits.
const noLocalFlags = 4

// noLocalSeries names the series of each noLocal bit.
var noLocalSeries = [noLocalFlags]struct{ family, policy string }{
	{backends.IPv4, "internal"}, {backends.IPv4, "external"},
	{backends.IPv6, "internal"}, {backends.IPv6, "external"},
}

// noLocalOf returns the flags of s; none for nil. As kube-proxy counts it,
// a port counts in a family only when it has a cluster IP and endpoints
// there (ready or serving terminating ones, anywhere: the plan holds no
// others), and a Local policy counts only when no endpoint of the family
// serves it here. Endpoints a hook plugin drained (weight 0) serve
// nothing, as in the backends.
func noLocalOf(s *plan.Service) noLocal {
	if s == nil || (!s.InternalLocal && !s.ExternalLocal) {
		return 0
	}
	var flags noLocal
	for i, is4 := range []bool{true, false} {
		inFamily := func(a netip.Addr) bool { return a.Is4() == is4 }
		if !slices.ContainsFunc(s.ClusterIPs, inFamily) {
			continue
		}
		has, local := false, false
		for _, e := range s.Endpoints {
			if inFamily(e.Address) {
				has = true
				local = local || (e.ForLocal && e.Weight > 0)
			}
		}
		if !has || local {
			continue
		}
		if s.InternalLocal {
			flags |= 1 << (2 * i)
		}
		if s.ExternalLocal {
			flags |= 1 << (2*i + 1)
		}
	}
	return flags
}

// noLocal returns the flags of the outcome's final services, aligned with
// its keys: a value computed before the commit, folded after it.
func (o *outcome) noLocal() []noLocal {
	out := make([]noLocal, len(o.final))
	for i, s := range o.final {
		out[i] = noLocalOf(s)
	}
	return out
}

// foldNoLocal stores the flags of a committed sync's keys, adjusting the
// counts by what changed only, and publishes the counts. A removed key
// (flags 0) leaves the map.
func (p *Proxy) foldNoLocal(keys []plan.Key, flags []noLocal) {
	for i, k := range keys {
		old, cur := p.noLocal[k], flags[i]
		if old == cur {
			continue
		}
		for bit := range noLocalFlags {
			p.noLocalCount[bit] += int(cur>>bit&1) - int(old>>bit&1)
		}
		if cur == 0 {
			delete(p.noLocal, k)
		} else {
			p.noLocal[k] = cur
		}
	}
	if m := p.opts.Metrics; m != nil {
		for bit, s := range noLocalSeries {
			m.NoLocalEndpoints(s.family, s.policy, p.noLocalCount[bit])
		}
	}
}
