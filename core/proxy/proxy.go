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
	"runtime/debug"
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
	// NodePorts is the range node ports must lie in (nodePortRange); the
	// zero value allows every port.
	NodePorts planner.PortRange
	// ServiceCIDRs are ranges cluster IPs come from (the serviceCIDRs
	// setting), added to those of the source's ServiceCIDR objects.
	ServiceCIDRs []netip.Prefix
	// Now is the clock of the health and metrics timestamps; nil means
	// time.Now.
	Now func() time.Time
	// ReleaseMemory is called after a committed sync that changed at
	// least releaseAfter services, and must not block the sync; nil
	// starts debug.FreeOSMemory in a goroutine of its own.
	ReleaseMemory func()
	Log           *slog.Logger
}

// releaseAfter is the size of a sync, in changed services, after which
// the proxy gives the memory it freed back to the kernel. A first sync of
// 10k services leaves about 35 MiB of freed heap that the Go runtime would
// otherwise keep (and return only slowly), and each later sync changes a
// few services; a forced collection of a heap of some 60 MiB costs a few
// tens of milliseconds of CPU, off the sync path.
const releaseAfter = 1000

// Metrics records the proxy's syncs and changes; *metrics.Metrics is one.
// A family is backends.IPv4 or backends.IPv6.
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
	// Pending sets how many services have Service changes, and how many
	// EndpointSlice changes there are, not yet synced.
	Pending(services, slices int)
	// NetworkProgrammed records the time from a change of an EndpointSlice
	// of family in the cluster to the commit of its rules.
	NetworkProgrammed(family string, d time.Duration)
	// NoLocalEndpoints sets how many services of family have a Local
	// traffic policy (policy "internal" or "external") and endpoints, but
	// none that serves that traffic on this node.
	NoLocalEndpoints(family, policy string, services int)
	// BackendFailed counts the writes of one backend Sync that the kernel
	// refused in family, and how many of them carried only changed services.
	BackendFailed(family string, failed, partial int)
	// BackendRules records, after a successful Sync, how many rules the
	// backend owns in table of family and how many that Sync wrote.
	BackendRules(family, table string, total, written int)
	// Reconciled records one pass of the conntrack reconciler over family:
	// how long it took and how many entries it deleted there.
	Reconciled(family string, took time.Duration, deleted int)
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
	// Clear deletes the entries of the flows a change made stale.
	Clear(ctx context.Context, flows []conntrack.Flow) (int, error)
	// Reconcile deletes every entry of the destinations that no serving
	// endpoint answers, and counts them per family.
	Reconcile(ctx context.Context, serving []conntrack.Serving) (conntrack.Deleted, error)
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
	// claims resolves service ports claiming one destination; unresolved
	// keeps the planner's own service of each key that lost a claim.
	claims     *planner.Claims
	unresolved map[plan.Key]*plan.Service
	// problems remembers each service's last reported bad input, and
	// conflicts each key's lost claims, so a warning is logged when they
	// appear or change, not on every sync.
	problems  map[string][]planner.Problem
	conflicts map[plan.Key][]planner.Problem
	// healthChecks holds the health check of every service that has one,
	// as last committed.
	healthChecks map[string]health.Service
	// noLocal holds, as last committed, the flags of the service ports
	// without local endpoints for a Local policy, and noLocalCount the
	// number of ports with each flag (nolocal.go).
	noLocal      map[plan.Key]noLocal
	noLocalCount [noLocalFlags]int
	// resync is set after a failed commit: the keys that commit carried are
	// no longer pending anywhere, so the next sync must be a full one.
	resync bool
	// pluginErr holds the plugin failures of the last sync, which the
	// hooks handled by their policies.
	pluginErr error
	// status and committedAt are what weir diagnose reads of past syncs
	// (view.go).
	status      SyncStatus
	committedAt map[plan.Key]time.Time

	// touched are the keys Touch asked to run through the hooks again,
	// guarded by touchMu (Touch must not wait for a sync in progress).
	touchMu sync.Mutex
	touched map[plan.Key]struct{}
}

// New returns a proxy with an empty plan.
func New(opts Options) *Proxy {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ReleaseMemory == nil {
		opts.ReleaseMemory = func() { go debug.FreeOSMemory() }
	}
	p := &Proxy{
		opts:      opts,
		log:       opts.Log,
		plan:      &plan.Plan{Node: plan.Node{Name: opts.NodeName}, Services: map[plan.Key]*plan.Service{}},
		final:     &plan.Plan{Node: plan.Node{Name: opts.NodeName}, Services: map[plan.Key]*plan.Service{}},
		byService: map[string][]plan.Key{},
		claims:    planner.NewClaims(), unresolved: map[plan.Key]*plan.Service{},
		problems: map[string][]planner.Problem{}, conflicts: map[plan.Key][]planner.Problem{},

		healthChecks: map[string]health.Service{}, noLocal: map[plan.Key]noLocal{},
		committedAt: map[plan.Key]time.Time{},
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

// Touch asks for a sync that runs the planned services of keys through the
// hook plugins again, though nothing changed in the cluster: the plugins
// with signals whose signals moved (hooks.Chain.Poll). Only the services
// whose final rules then differ reach the backend.
func (p *Proxy) Touch(keys ...plan.Key) {
	if len(keys) == 0 {
		return
	}
	p.touchMu.Lock()
	if p.touched == nil {
		p.touched = map[plan.Key]struct{}{}
	}
	for _, k := range keys {
		p.touched[k] = struct{}{}
	}
	p.touchMu.Unlock()
	if t := p.trigger.Load(); t != nil {
		(*t)()
	}
}

// withTouched returns planned with the touched keys still in the plan
// added, and forgets them.
func (p *Proxy) withTouched(planned []plan.Key) []plan.Key {
	p.touchMu.Lock()
	touched := p.touched
	p.touched = nil
	p.touchMu.Unlock()
	if len(touched) == 0 {
		return planned
	}
	for _, k := range planned {
		delete(touched, k)
	}
	for k := range touched {
		if p.plan.Services[k] != nil {
			planned = append(planned, k)
		}
	}
	return planned
}

// RequestFullSync makes the next sync a full one and asks the runner for it
// (after a hook plugin was reloaded, every service must pass through it).
func (p *Proxy) RequestFullSync() {
	p.mu.Lock()
	p.resync = true
	p.mu.Unlock()
	p.requestSync()
}

// Sync plans the services touched since the last sync and commits the
// result with the backend: with full set, the whole plan (after the hook
// plugins, which see every service again). A full sync plans no more than
// a partial one: the planner is pure, so the plan already holds what it
// would plan again for every untouched service. The sync after a failed
// one is always full.
func (p *Proxy) Sync(ctx context.Context, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.opts.Now()
	full = full || p.resync
	snap, triggers := p.in.checkout()
	err := p.sync(ctx, snap, full)
	p.record(full, start, triggers, err)
	return err
}

// PluginFailures returns the plugin failures of the last sync, which the
// hooks handled by their failure policies (the sync itself succeeded); nil
// when there were none. weir sync --once reports them.
func (p *Proxy) PluginFailures() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pluginErr
}

// record tells the health state and the metrics how a sync that started
// at start ended. The trigger times of a failed sync wait for the next.
func (p *Proxy) record(full bool, start time.Time, triggers []trigger, err error) {
	if p.opts.Backend == nil {
		return
	}
	m := p.opts.Metrics
	if err != nil {
		p.in.restore(triggers)
		if p.opts.Health != nil {
			// The rules the kernel should have wait for the retry, whether
			// or not a change was queued: the timeout runs from now.
			p.opts.Health.Queued()
		}
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
		m.NetworkProgrammed(t.family, end.Sub(t.at))
	}
}

// sync is Sync with the lock held, on the tracker's snapshot. Its results
// (the final plan, the flows to clear, the health checks, the services
// without local endpoints) are folded into the proxy's state only once the
// backend accepted them; a failed commit leaves them to the retry, which
// is a full sync.
func (p *Proxy) sync(ctx context.Context, snap tracker.Snapshot, full bool) error {
	start := time.Now()
	p.log.Info("Syncing rules", "full", full)
	node, cidrs := p.plan.Node, p.plan.ServiceCIDRs
	planned := p.withTouched(p.update(snap, full))
	hooksStart := time.Now()
	out := p.applyHooks(ctx, planned, full)
	hooksTook := time.Since(hooksStart)
	p.pluginErr = out.pluginErr
	// A node change alone (podCIDRs, addresses), or one of the service
	// CIDRs, still reaches the backend, with no changed services.
	nodeChanged := !slices.Equal(node.PodCIDRs, p.plan.Node.PodCIDRs) || !slices.Equal(node.Addresses, p.plan.Node.Addresses) ||
		!slices.Equal(cidrs, p.plan.ServiceCIDRs)
	undo := out.apply(p.final)
	checks := p.healthChecksOf(out.names)
	noLocal := out.noLocal()
	if p.opts.Backend == nil || (!full && len(out.changed) == 0 && !nodeChanged) {
		p.foldHealthChecks(checks)
		p.foldNoLocal(out.keys, noLocal)
		if p.opts.Backend != nil {
			p.noteSync(full, start, time.Now(), nil, nil)
		}
		return nil
	}
	req := backends.SyncRequest{Full: full, Changed: out.changed}
	err := p.opts.Backend.Sync(ctx, p.final, req)
	p.reportBackend()
	p.noteSync(full, start, time.Now(), out.changed, err)
	if err != nil {
		undo()
		p.resync = true
		p.log.Error("Failed to execute sync; retrying with a full sync", "error", err, "full", full,
			"services", keyList(req))
		return err
	}
	p.resync = false
	p.foldHealthChecks(checks)
	p.foldNoLocal(out.keys, noLocal)
	if full {
		p.reconcileFlows(ctx)
	} else {
		p.clearStaleFlows(ctx, out.stale)
	}
	p.syncHealthChecks()
	attrs := []any{"full", full, "services", len(p.final.Services), "changed", len(out.changed),
		"duration", time.Since(start).Round(time.Microsecond)}
	if p.opts.Hooks != nil {
		attrs = append(attrs, "hooks", hooksTook.Round(time.Microsecond))
	}
	p.log.Info("Synced rules", attrs...)
	if len(out.changed) >= releaseAfter {
		p.opts.ReleaseMemory()
	}
	return nil
}

// keyList names up to ten of the keys a failed sync carried, so the log
// points at the services to look at; "all" for a full sync.
func keyList(req backends.SyncRequest) string {
	if req.Full {
		return "all"
	}
	keys := req.Changed
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

// clearStaleFlows deletes the conntrack entries the committed changes left
// pointing at removed endpoints (or at nothing), so UDP clients that keep
// their source port are not black-holed until the entries time out.
func (p *Proxy) clearStaleFlows(ctx context.Context, stale []conntrack.Flow) {
	if p.opts.Conntrack == nil || len(stale) == 0 {
		return
	}
	n, err := p.opts.Conntrack.Clear(ctx, stale)
	if err != nil {
		p.log.Warn("Failed to clear stale conntrack entries", "error", err)
	}
	if n > 0 {
		p.log.Info("Cleared stale conntrack entries", "entries", n, "flows", len(stale))
	}
}

// reconcileFlows runs the conntrack reconciler over every UDP and SCTP
// service port of the committed plan, at the first sync and then at each
// full one, like kube-proxy's: it deletes the entries no serving endpoint
// answers, and spares the others. A restart therefore cuts no flow that
// still has its endpoint (clearing every flow of a service that "gets its
// first endpoint", as the first sync of a process sees every service, made
// each restart break DNS for a moment: kubernetes#122740). It also covers
// what a full sync's changes made stale.
func (p *Proxy) reconcileFlows(ctx context.Context) {
	if p.opts.Conntrack == nil {
		return
	}
	var serving []conntrack.Serving
	for _, s := range p.final.Services {
		serving = append(serving, conntrack.ServingOf(s)...)
	}
	if len(serving) == 0 {
		return
	}
	start := time.Now()
	n, err := p.opts.Conntrack.Reconcile(ctx, serving)
	if m := p.opts.Metrics; m != nil {
		// One pass reads both families' entries: its duration is each's.
		took := time.Since(start)
		m.Reconciled(backends.IPv4, took, n.IPv4)
		m.Reconciled(backends.IPv6, took, n.IPv6)
	}
	if err != nil {
		p.log.Warn("Failed to reconcile conntrack entries", "error", err)
	}
	if n.Total() > 0 {
		p.log.Info("Deleted conntrack entries no serving endpoint answers", "entries", n.Total(), "destinations", len(serving))
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
		_ = <-errc // what the source returns once cancelled says nothing
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
