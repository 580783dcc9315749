// Package proxy assembles Weir's pipeline: a source feeds the tracker, the
// runner decides when to sync, the planner turns touched services into plan
// services, and a backend commits them.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/runner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
	"github.com/weirproxy/weir/sdk/plan"
)

// Options configures a Proxy.
type Options struct {
	NodeName string
	// Backend commits plans; nil computes plans only (weir plan).
	Backend backends.Backend
	// HealthChecks, when set, serves the health-check node ports of
	// externalTrafficPolicy: Local load balancers after every sync.
	HealthChecks HealthChecks
	// Conntrack, when set, clears the flows a committed change made stale.
	Conntrack Conntrack
	// Hooks, when set, runs the hook plugins over every planned service
	// before the backend sees it.
	Hooks Hooks
	// Health, when set, learns of queued changes, successful syncs and
	// whether this Node is being deleted, for /healthz and /livez.
	Health *health.Proxy
	// Metrics, when set, records syncs and changes.
	Metrics Metrics
	// Now is the clock of the health and metrics timestamps; nil means
	// time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Metrics records the proxy's syncs and changes; *metrics.Metrics is one.
type Metrics interface {
	// Synced records a successful sync that took took and ended at end.
	Synced(full bool, took time.Duration, end time.Time)
	// CommitFailed counts a plan the backend failed to commit.
	CommitFailed()
	// Queued records that a sync was asked for at t.
	Queued(t time.Time)
	// ServiceChanged and EndpointsChanged count one object change each.
	ServiceChanged()
	EndpointsChanged()
	// Pending sets how many services have changes not yet synced.
	Pending(services, endpoints int)
	// NetworkProgrammed records the time from an EndpointSlice change in
	// the cluster to the commit of its rules.
	NetworkProgrammed(d time.Duration)
}

// Hooks runs hook plugins over plan services; *hooks.Chain is one.
type Hooks interface {
	// Apply returns the services the backend must use, aligned with
	// services; nil means no rules. Its error reports plugin failures the
	// hooks already handled by their failure policy and logged.
	Apply(ctx context.Context, node plan.Node, services []*plan.Service, full bool) ([]*plan.Service, error)
	// Forget drops what the hooks remember of removed services.
	Forget(keys ...plan.Key)
}

// Conntrack deletes stale UDP/SCTP flows; *conntrack.Cleaner is one.
type Conntrack interface {
	Clear(ctx context.Context, flows []conntrack.Flow) (int, error)
}

// HealthChecks serves load-balancer health checks; *health.Servers is one.
type HealthChecks interface {
	Sync(services []health.Service) error
}

// Proxy owns the desired plan and drives syncs.
type Proxy struct {
	opts    Options
	log     *slog.Logger
	tracker *tracker.Tracker
	// in feeds the tracker; it is the source's handler.
	in *inbound
	// trigger asks for a sync; set by Run and LoadOnce, called from the
	// source's goroutine and by RequestFullSync.
	trigger atomic.Pointer[func()]

	mu sync.Mutex
	// plan is the planner's output; final is what the backend commits:
	// plan after the hook plugins (the same services when there are none).
	plan      *plan.Plan
	final     *plan.Plan
	byService map[string][]plan.Key // namespace/name -> its keys in plan
	// problems remembers each service's last reported bad input, so a
	// warning is logged when it appears or changes, not on every sync.
	problems map[string][]planner.Problem
	// healthChecks holds the health check of every service that has one.
	healthChecks map[string]health.Service
	// stale collects, during one sync, the flows its changes make stale.
	stale []conntrack.Flow
	// resync is set after a failed commit: the keys that commit carried are
	// no longer pending anywhere, so the next sync must be a full one.
	resync bool
}

// New returns a proxy with an empty plan.
func New(opts Options) *Proxy {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	p := &Proxy{
		opts:      opts,
		log:       opts.Log,
		plan:      &plan.Plan{Node: plan.Node{Name: opts.NodeName}, Services: map[plan.Key]*plan.Service{}},
		final:     &plan.Plan{Node: plan.Node{Name: opts.NodeName}, Services: map[plan.Key]*plan.Service{}},
		byService: map[string][]plan.Key{},
		problems:  map[string][]planner.Problem{},

		healthChecks: map[string]health.Service{},
	}
	p.tracker = tracker.New(func() {
		p.requestSync()
	})
	p.in = newInbound(p, opts.Now())
	return p
}

// Handler returns the handler a source must feed.
func (p *Proxy) Handler() source.Handler { return p.in }

// Plan returns a copy of the current desired plan, after the hook plugins.
func (p *Proxy) Plan() *plan.Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.final.Clone()
}

// Planned returns a copy of the planner's plan, before the hook plugins.
func (p *Proxy) Planned() *plan.Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plan.Clone()
}

// requestSync calls the trigger Run or LoadOnce installed, if any. Once
// the source has delivered its initial objects, the request is a queued
// change for the health state and the metrics.
func (p *Proxy) requestSync() {
	if (p.opts.Health != nil || p.opts.Metrics != nil) && p.tracker.Synced() {
		if p.opts.Health != nil {
			p.opts.Health.Queued()
		}
		if p.opts.Metrics != nil {
			p.opts.Metrics.Queued(p.opts.Now())
		}
	}
	if t := p.trigger.Load(); t != nil {
		(*t)()
	}
}

func (p *Proxy) setTrigger(f func()) { p.trigger.Store(&f) }

// RequestFullSync makes the next sync a full one and asks the runner for it
// (after a hook plugin was reloaded, every service must pass through it).
func (p *Proxy) RequestFullSync() {
	p.mu.Lock()
	p.resync = true
	p.mu.Unlock()
	p.requestSync()
}

// Sync plans the services touched since the last sync (every service when
// full is set) and commits the result with the backend. The sync after a
// failed one is always full.
func (p *Proxy) Sync(ctx context.Context, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.opts.Now()
	full = full || p.resync
	snap, triggers := p.in.checkout(full)
	err := p.sync(ctx, snap, full)
	p.record(full, start, triggers, err)
	return err
}

// record tells the health state and the metrics how a sync that started
// at start ended. The trigger times of a failed sync wait for the next.
func (p *Proxy) record(full bool, start time.Time, triggers []time.Time, err error) {
	if p.opts.Backend == nil {
		return
	}
	m := p.opts.Metrics
	if err != nil {
		p.in.restore(triggers)
		if m != nil {
			m.CommitFailed()
		}
		return
	}
	end := p.opts.Now()
	if p.opts.Health != nil {
		p.opts.Health.Updated()
	}
	if m == nil {
		return
	}
	m.Synced(full, end.Sub(start), end)
	for _, t := range triggers {
		m.NetworkProgrammed(end.Sub(t))
	}
}

// sync is Sync with the lock held, on the tracker's snapshot.
func (p *Proxy) sync(ctx context.Context, snap tracker.Snapshot, full bool) error {
	start := time.Now()
	p.log.Info("Syncing rules", "full", full)
	node := p.plan.Node
	p.stale = p.stale[:0]
	planned := p.update(snap, full)
	hooksStart := time.Now()
	changed := p.applyHooks(ctx, planned, full)
	hooksTook := time.Since(hooksStart)
	// A node change alone (podCIDRs, addresses) still reaches the backend,
	// with no changed services.
	nodeChanged := !slices.Equal(node.PodCIDRs, p.plan.Node.PodCIDRs) || !slices.Equal(node.Addresses, p.plan.Node.Addresses)
	if p.opts.Backend == nil || (!full && len(changed) == 0 && !nodeChanged) {
		return nil
	}
	keys := changed
	if full {
		keys = nil
	} else if keys == nil {
		keys = []plan.Key{} // partial, not full: nothing but the node changed
	}
	if err := p.opts.Backend.Sync(ctx, p.final, keys); err != nil {
		p.resync = true
		p.log.Error("Failed to execute sync; keeping the previous rules", "error", err, "full", full,
			"services", keyList(keys))
		return err
	}
	p.resync = false
	p.clearStaleFlows(ctx)
	p.syncHealthChecks()
	attrs := []any{"full", full, "services", len(p.final.Services), "changed", len(changed),
		"duration", time.Since(start).Round(time.Microsecond)}
	if p.opts.Hooks != nil {
		attrs = append(attrs, "hooks", hooksTook.Round(time.Microsecond))
	}
	p.log.Info("Synced rules", attrs...)
	return nil
}

// keyList names up to ten of the keys a failed sync carried, so the log
// points at the services to look at; "all" for a full sync.
func keyList(keys []plan.Key) string {
	if keys == nil {
		return "all"
	}
	var b strings.Builder
	for i, k := range keys {
		if i == 10 {
			fmt.Fprintf(&b, " and %d more", len(keys)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k.String())
	}
	return b.String()
}

// update applies the tracker's pending changes to the planner's plan and
// returns the keys whose plan service changed.
func (p *Proxy) update(snap tracker.Snapshot, full bool) []plan.Key {
	if snap.NodeChanged && !full {
		// The node's zone decides topology for every service: replan them all
		// (the backend still gets only the keys whose plan changed).
		zone := p.plan.Node.Zone
		if planner.Node(p.opts.NodeName, snap.Node).Zone != zone {
			all := p.tracker.Checkout(true)
			maps.Copy(snap.Services, all.Services)
		}
	}
	if snap.NodeChanged || full {
		p.plan.Node = planner.Node(p.opts.NodeName, snap.Node)
	}
	cfg := planner.Config{NodeName: p.opts.NodeName, Zone: p.plan.Node.Zone}
	var changed []plan.Key
	for _, name := range slices.Sorted(maps.Keys(snap.Services)) {
		services, problems := planner.Service(cfg, snap.Services[name])
		p.reportProblems(name, problems)
		changed = p.replace(name, services, changed, !full)
	}
	return changed
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

// replace swaps one service's keys in the plan for its new plan services and
// appends the keys that changed.
func (p *Proxy) replace(name string, services []*plan.Service, changed []plan.Key, logEach bool) []plan.Key {
	var keys []plan.Key
	for _, s := range services {
		keys = append(keys, s.Key)
		old := p.plan.Services[s.Key]
		if old.Equal(s) {
			continue
		}
		if logEach {
			p.logChange(old, s)
		}
		p.plan.Services[s.Key] = s
		changed = append(changed, s.Key)
	}
	for _, k := range p.byService[name] {
		if !slices.Contains(keys, k) {
			if logEach {
				p.log.Info("Removing service", "service", k.String())
			}
			delete(p.plan.Services, k)
			changed = append(changed, k)
		}
	}
	if len(keys) == 0 {
		delete(p.byService, name)
	} else {
		p.byService[name] = keys
	}
	return changed
}

// updateHealthCheck records the health check of one service from its final
// plan services: its port and how many distinct endpoints on this node
// serve its Local traffic.
func (p *Proxy) updateHealthCheck(name string) {
	delete(p.healthChecks, name)
	var local []netip.Addr
	for _, k := range p.byService[name] {
		s := p.final.Services[k]
		if s == nil || s.HealthCheckNodePort == 0 {
			continue
		}
		hc := p.healthChecks[name]
		hc.Namespace, hc.Name, hc.Port = s.Key.Namespace, s.Key.Name, s.HealthCheckNodePort
		for _, e := range s.Endpoints {
			if e.ForLocal && !slices.Contains(local, e.Address) {
				local = append(local, e.Address)
			}
		}
		hc.LocalEndpoints = len(local)
		p.healthChecks[name] = hc
	}
}

// clearStaleFlows deletes the conntrack entries the committed changes left
// pointing at removed endpoints (or at nothing), so UDP clients that keep
// their source port are not black-holed until the entries time out.
func (p *Proxy) clearStaleFlows(ctx context.Context) {
	if p.opts.Conntrack == nil || len(p.stale) == 0 {
		return
	}
	n, err := p.opts.Conntrack.Clear(ctx, p.stale)
	if err != nil {
		p.log.Warn("Failed to clear stale conntrack entries", "error", err)
	}
	if n > 0 {
		p.log.Info("Cleared stale conntrack entries", "entries", n, "flows", len(p.stale))
	}
}

// syncHealthChecks hands the health-check servers the current set; a port
// that cannot be served is logged and retried on the next sync.
func (p *Proxy) syncHealthChecks() {
	if p.opts.HealthChecks == nil {
		return
	}
	list := make([]health.Service, 0, len(p.healthChecks))
	for _, name := range slices.Sorted(maps.Keys(p.healthChecks)) {
		list = append(list, p.healthChecks[name])
	}
	if err := p.opts.HealthChecks.Sync(list); err != nil {
		p.log.Warn("Failed to serve health check node ports", "error", err)
	}
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

// LoadOnce runs src until it has delivered its initial objects, then stops it.
func (p *Proxy) LoadOnce(ctx context.Context, src source.Source) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	synced := make(chan struct{})
	var once sync.Once
	p.setTrigger(func() {
		if p.tracker.Synced() {
			once.Do(func() { close(synced) })
		}
	})
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, p.in) }()
	select {
	case <-synced:
		cancel()
		<-errc
		return nil
	case err := <-errc:
		if err == nil {
			err = errors.New("source stopped before its initial sync")
		}
		return err
	}
}

// Run feeds the tracker from src and syncs on the runner's schedule until ctx
// is done. The first sync waits for the source's initial objects. Rules are
// left in place on return.
func (p *Proxy) Run(ctx context.Context, src source.Source, opts runner.Options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := runner.New(p.Sync, opts)
	synced := make(chan struct{})
	var once sync.Once
	p.setTrigger(func() {
		if p.tracker.Synced() {
			once.Do(func() { close(synced) })
			r.Trigger()
		}
	})
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, p.in) }()
	select {
	case <-synced:
	case err := <-errc:
		return sourceResult(ctx, err)
	case <-ctx.Done():
		return nil
	}
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	select {
	case err := <-errc:
		err = sourceResult(ctx, err)
		cancel()
		<-done
		return err
	case <-done:
		return nil
	}
}

// sourceResult is what Run returns once the source's Run returned err: nil
// when ctx is done and the source stopped cleanly, else an error.
func sourceResult(ctx context.Context, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("source: %w", err)
	case ctx.Err() != nil:
		return nil
	}
	return errors.New("source: stopped before its context was done")
}
