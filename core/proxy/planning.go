package proxy

import (
	"maps"
	"slices"
	"time"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/tracker"
	"github.com/weirproxy/weir/sdk/plan"
)

// update applies the tracker's pending changes to the planner's plan and
// returns the keys whose plan service changed. Conflicting claims between
// service ports (one cluster IP and port, one node port) are resolved here,
// before anything reaches the hooks or the kernel: the older object keeps
// the destination, and a change to one claimant replans the others.
func (p *Proxy) update(snap tracker.Snapshot, full bool) []plan.Key {
	if snap.NodeChanged && planner.Node(p.opts.NodeName, snap.Node).Zone != p.plan.Node.Zone {
		// The node's zone decides topology for every service: replan them all
		// (the backend still gets only the keys whose plan changed).
		all := p.tracker.Checkout(true)
		maps.Copy(snap.Services, all.Services)
	}
	if snap.NodeChanged || full {
		p.plan.Node = planner.Node(p.opts.NodeName, snap.Node)
	}
	p.plan.ServiceCIDRs = planner.ServiceCIDRs(p.opts.ServiceCIDRs, snap.ServiceCIDRs)
	cfg := planner.Config{NodeName: p.opts.NodeName, Zone: p.plan.Node.Zone, NodePorts: p.opts.NodePorts}
	fresh := map[plan.Key]*plan.Service{}
	affected := map[plan.Key]bool{}
	for _, name := range slices.Sorted(maps.Keys(snap.Services)) {
		st := snap.Services[name]
		services, problems := planner.Service(cfg, st)
		p.reportProblems(name, problems)
		p.claim(name, services, created(st), fresh, affected)
	}
	var changed []plan.Key
	for _, k := range slices.SortedFunc(maps.Keys(affected), plan.Key.Compare) {
		if p.resolve(k, fresh, !full) {
			changed = append(changed, k)
		}
	}
	return changed
}

// created is the creation time of a service's object; zero when it has
// none (a deleted service, or a manifest without one).
func created(st tracker.ServiceState) time.Time {
	if st.Service == nil {
		return time.Time{}
	}
	return st.Service.Created
}

// claim records one service's new plan services: their claims, the keys
// they now have (byService) and the keys to resolve again, which are its
// old and new keys and every other claimant of a destination they gained
// or released.
func (p *Proxy) claim(name string, services []*plan.Service, created time.Time, fresh map[plan.Key]*plan.Service, affected map[plan.Key]bool) {
	keys := make([]plan.Key, 0, len(services))
	for _, s := range services {
		keys = append(keys, s.Key)
	}
	for _, k := range p.byService[name] {
		affected[k] = true
		if !slices.Contains(keys, k) {
			fresh[k] = nil
			for _, o := range p.claims.Set(k, nil, time.Time{}) {
				affected[o] = true
			}
		}
	}
	for _, s := range services {
		fresh[s.Key] = s
		affected[s.Key] = true
		for _, o := range p.claims.Set(s.Key, s, created) {
			affected[o] = true
		}
	}
	if len(keys) == 0 {
		delete(p.byService, name)
	} else {
		p.byService[name] = keys
	}
}

// raw returns the planner's service for k before conflicts were resolved:
// the one planned in this sync, else the one kept aside because it lost a
// claim, else the plan's own.
func (p *Proxy) raw(k plan.Key, fresh map[plan.Key]*plan.Service) *plan.Service {
	if s, ok := fresh[k]; ok {
		return s
	}
	if s, ok := p.unresolved[k]; ok {
		return s
	}
	return p.plan.Services[k]
}

// resolve stores k's plan service with the destinations other claimants win
// taken out, logs conflicts that appeared or changed, and reports whether
// the plan service changed.
func (p *Proxy) resolve(k plan.Key, fresh map[plan.Key]*plan.Service, logEach bool) bool {
	raw := p.raw(k, fresh)
	old := p.plan.Services[k]
	if raw == nil {
		delete(p.unresolved, k)
		p.reportConflicts(k, nil)
		if old == nil {
			return false
		}
		if logEach {
			p.log.Info("Removing service", "service", k.String())
		}
		delete(p.plan.Services, k)
		return true
	}
	s, problems := p.claims.Resolve(raw)
	if s != raw {
		p.unresolved[k] = raw
	} else {
		delete(p.unresolved, k)
	}
	p.reportConflicts(k, problems)
	if old.Equal(s) {
		return false
	}
	if logEach {
		p.logChange(old, s)
	}
	p.plan.Services[k] = s
	return true
}

// reportProblems logs a service's skipped input once per change of it.
func (p *Proxy) reportProblems(name string, problems []planner.Problem) {
	if slices.Equal(p.problems[name], problems) {
		return
	}
	for _, pr := range problems {
		p.log.Warn("Skipping invalid input", "object", pr.Object, "field", pr.Field, "reason", pr.Reason)
	}
	if len(problems) == 0 {
		delete(p.problems, name)
	} else {
		p.problems[name] = problems
	}
}

// reportConflicts logs the destinations a service port loses to other
// claimants when they change, and when the last of them is resolved.
func (p *Proxy) reportConflicts(k plan.Key, problems []planner.Problem) {
	old := p.conflicts[k]
	if slices.Equal(old, problems) {
		return
	}
	for _, pr := range problems {
		p.log.Warn("Skipping conflicting destination", "service", k.String(), "object", pr.Object,
			"field", pr.Field, "reason", pr.Reason)
	}
	if len(problems) == 0 {
		delete(p.conflicts, k)
		p.log.Info("Service port no longer conflicts with another", "service", k.String())
		return
	}
	p.conflicts[k] = problems
}

func (p *Proxy) logChange(old, cur *plan.Service) {
	if old == nil {
		p.log.Info("Adding new service", "service", cur.Key.String(), "endpoints", len(cur.Endpoints))
		return
	}
	onlyEndpoints := old.Clone()
	onlyEndpoints.Endpoints = cur.Endpoints
	if onlyEndpoints.Equal(cur) {
		p.log.Info("Updating endpoints", "service", cur.Key.String(), "endpoints", len(cur.Endpoints))
		return
	}
	p.log.Info("Updating service", "service", cur.Key.String(), "endpoints", len(cur.Endpoints))
}
