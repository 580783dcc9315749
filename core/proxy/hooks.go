package proxy

import (
	"context"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

// applyHooks runs the hook plugins over the planned services that changed
// (all of them on a full sync), updates the final plan and returns the keys
// whose rules changed. Without hooks the final services are the planned ones.
func (p *Proxy) applyHooks(ctx context.Context, planned []plan.Key, full bool) []plan.Key {
	p.final.Node = p.plan.Node
	keys := planned
	if full {
		keys = p.plan.Keys()
		for k := range p.final.Services {
			if _, ok := p.plan.Services[k]; !ok {
				keys = append(keys, k)
			}
		}
	}
	in := make([]*plan.Service, 0, len(keys))
	present := make([]plan.Key, 0, len(keys))
	var gone []plan.Key
	for _, k := range keys {
		if s := p.plan.Services[k]; s != nil {
			in = append(in, s)
			present = append(present, k)
		} else {
			gone = append(gone, k)
		}
	}
	out := p.runHooks(ctx, in, gone, full)
	var changed []plan.Key
	names := map[string]bool{}
	for i, k := range present {
		changed = p.setFinal(k, out[i], changed)
		names[k.Namespace+"/"+k.Name] = true
	}
	for _, k := range gone {
		changed = p.setFinal(k, nil, changed)
		names[k.Namespace+"/"+k.Name] = true
	}
	for name := range names {
		p.updateHealthCheck(name)
	}
	return changed
}

// runHooks returns the hooked services for in (in itself without hooks).
func (p *Proxy) runHooks(ctx context.Context, in []*plan.Service, gone []plan.Key, full bool) []*plan.Service {
	if p.opts.Hooks == nil {
		return in
	}
	if len(gone) > 0 {
		p.opts.Hooks.Forget(gone...)
	}
	if len(in) == 0 && !full {
		return in
	}
	// The hooks log each plugin failure with its policy; the error is for
	// counting them.
	out, _ := p.opts.Hooks.Apply(ctx, p.plan.Node, in, full)
	return out
}

// setFinal stores one final service (nil removes it), collects the flows
// its change makes stale and appends its key when its rules changed. Each
// key comes here at most once per sync.
func (p *Proxy) setFinal(k plan.Key, s *plan.Service, changed []plan.Key) []plan.Key {
	old := p.final.Services[k]
	if s == nil {
		delete(p.final.Services, k)
	} else {
		p.final.Services[k] = s
	}
	if old.SameRules(s) {
		return changed
	}
	p.stale = append(p.stale, conntrack.StaleFlows(old, s)...)
	return append(changed, k)
}
