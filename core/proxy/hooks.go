package proxy

import (
	"context"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

// outcome is what one sync changes in the final plan, computed before the
// commit. The proxy applies it to the final plan for the backend and undoes
// it when the commit fails, so that a retry sees the same changes again.
type outcome struct {
	keys  []plan.Key      // every key whose final service was computed
	final []*plan.Service // aligned with keys; nil removes the service
	// changed are the keys whose rules changed: what the backend must write.
	changed []plan.Key
	// stale are the flows the changes leave pointing at removed endpoints;
	// a full sync reconciles every flow instead (see reconcileFlows), so
	// it does not compute them.
	stale []conntrack.Flow
	full  bool
	// names are the services whose health checks follow the change.
	names map[string]bool
	// pluginErr reports plugin failures the hooks handled by policy.
	pluginErr error
}

// apply writes the outcome into final and returns the function restoring
// what it replaced.
func (o *outcome) apply(final *plan.Plan) (undo func()) {
	old := make([]*plan.Service, len(o.keys))
	for i, k := range o.keys {
		old[i] = final.Services[k]
		setService(final, k, o.final[i])
	}
	return func() {
		for i, k := range o.keys {
			setService(final, k, old[i])
		}
	}
}

func setService(p *plan.Plan, k plan.Key, s *plan.Service) {
	if s == nil {
		delete(p.Services, k)
	} else {
		p.Services[k] = s
	}
}

// applyHooks runs the hook plugins over the planned services that changed
// (all of them on a full sync) and returns the final services and what their
// change means. Without hooks the final services are the planned ones.
func (p *Proxy) applyHooks(ctx context.Context, planned []plan.Key, full bool) *outcome {
	p.final.Node, p.final.ServiceCIDRs = p.plan.Node, p.plan.ServiceCIDRs
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
	out := &outcome{names: map[string]bool{}, full: full}
	var services []*plan.Service
	services, out.pluginErr = p.runHooks(ctx, in, gone, full)
	if p.opts.Hooks != nil {
		p.keepWithoutLastGood(ctx, in, services)
	}
	for i, k := range present {
		out.add(k, p.final.Services[k], services[i])
	}
	for _, k := range gone {
		out.add(k, p.final.Services[k], nil)
	}
	return out
}

// runHooks returns the hooked services for in (in itself without hooks)
// and the plugin failures the hooks handled.
func (p *Proxy) runHooks(ctx context.Context, in []*plan.Service, gone []plan.Key, full bool) ([]*plan.Service, error) {
	if p.opts.Hooks == nil {
		return in, nil
	}
	if len(gone) > 0 {
		p.opts.Hooks.Forget(gone...)
	}
	if len(in) == 0 && !full {
		return in, nil
	}
	// The hooks log each plugin failure with its policy.
	return p.opts.Hooks.Apply(ctx, p.plan.Node, in, full)
}

// add records one key's final service (nil: removed), the flows its change
// makes stale, and whether its rules changed. Each key comes here at most
// once per sync.
func (o *outcome) add(k plan.Key, old, s *plan.Service) {
	o.keys = append(o.keys, k)
	o.final = append(o.final, s)
	o.names[k.Namespace+"/"+k.Name] = true
	if old.SameRules(s) {
		return
	}
	if !o.full {
		o.stale = append(o.stale, conntrack.StaleFlows(old, s)...)
	}
	o.changed = append(o.changed, k)
}
