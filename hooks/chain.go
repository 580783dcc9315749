// Package hooks runs Weir's hook plugins: WebAssembly modules, sandboxed in
// wazero, that may re-weight, reorder or drop a service's endpoints and set
// its affinity and scheduler before the plan reaches the backend. The
// binary contract is docs/plugin-abi.md; every output is validated, so a
// plugin can never send traffic where the cluster did not.
//
// A Chain calls its plugins in order, each on the previous one's output,
// sends each plugin only the services it has not yet seen (its results are
// cached per service), applies a plugin's failure policy when a call fails,
// quarantines plugins that keep failing and reloads plugin files that change.
package hooks

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// Chain runs services through the configured plugins. Its methods are safe
// for concurrent use; Applies run one at a time.
type Chain struct {
	opts  Options
	log   *slog.Logger
	cache wazero.CompilationCache // nil without plugins
	mods  modules                 // the compiled modules the plugins share

	loadMu sync.Mutex // held while Watch loads a new plugin version, and by Close

	mu       sync.Mutex
	slots    []*slot // in config order; the slice never changes after New
	node     plan.Node
	lastGood map[plan.Key]*plan.Service // last chain output without failures
	encs     [maxWorkers]abi.Encoder    // one per concurrent call
	closed   bool
}

// slot is one configured plugin and its per-service cache. Its fields are
// guarded by Chain.mu.
type slot struct {
	*settings
	index     int
	p         *plugin // nil while an open plugin could not be loaded
	cache     map[plan.Key]entry
	health    health
	failedSHA string // the file version that last failed to reload
}

// entry remembers a plugin's output for one service version, by pointer.
type entry struct{ in, out *plan.Service }

// New loads the plugins. A closed plugin that cannot be loaded fails New;
// an open one is logged and passes its services through until a reload
// succeeds.
func New(ctx context.Context, plugins []Config, opts Options) (*Chain, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := joined(Check(plugins)); err != nil {
		return nil, err
	}
	c := &Chain{opts: opts, log: opts.Log, lastGood: map[plan.Key]*plan.Service{}}
	for i, cfg := range plugins {
		s, err := complete(cfg)
		if err != nil {
			return nil, err
		}
		c.slots = append(c.slots, &slot{settings: s, index: i, cache: map[plan.Key]entry{}})
	}
	if len(c.slots) == 0 {
		return c, nil
	}
	c.cache = newCompilationCache(opts.CacheDir, c.log)
	errs := c.openAll(ctx)
	for i, s := range c.slots {
		err := errs[i]
		if err != nil && s.FailurePolicy == PolicyClosed {
			return nil, errors.Join(err, c.Close(ctx))
		}
		if err != nil {
			c.log.Error("Plugin not loaded; its services pass through until its file is fixed",
				"plugin", s.Name, "error", err)
			continue
		}
		c.log.Info("Loaded plugin", "plugin", s.Name, "path", s.Path, "sha256", s.p.sha)
	}
	return c, nil
}

// openAll loads every slot's plugin, as many at once as there are CPUs
// (compiling, or reading the compilation cache, and instantiating take
// tens of milliseconds each, on the path to a restart's first sync), and
// returns each slot's error.
func (c *Chain) openAll(ctx context.Context) []error {
	errs := make([]error, len(c.slots))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, s := range c.slots {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s.p, errs[i] = open(ctx, s.settings, &c.mods, c.cache, c.log)
		})
	}
	wg.Wait()
	return errs
}

// newCompilationCache returns a cache in dir, or in memory when dir is ""
// or unusable.
func newCompilationCache(dir string, log *slog.Logger) wazero.CompilationCache {
	if dir == "" {
		return wazero.NewCompilationCache()
	}
	cache, err := wazero.NewCompilationCacheWithDir(dir)
	if err == nil {
		err = probe(dir)
	}
	if err != nil {
		log.Warn("Plugin compilation cache unavailable; compiling in memory", "dir", dir, "error", err)
		return wazero.NewCompilationCache()
	}
	return cache
}

// probe checks that dir is writable.
func probe(dir string) error {
	f, err := os.CreateTemp(dir, ".weir-probe-*")
	if err != nil {
		return err
	}
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

// Apply runs services through the chain and returns the services to use,
// aligned with the input; a nil entry means no rules for that service.
// full says services is the whole plan: cache entries of services not in
// it are dropped. The error is nil or joins *PluginError values for
// failures already handled by the plugins' policies.
func (c *Chain) Apply(ctx context.Context, node plan.Node, services []*plan.Service, full bool) ([]*plan.Service, error) {
	out := slices.Clone(services)
	if len(c.slots) == 0 {
		return out, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if node.Name != c.node.Name || node.Zone != c.node.Zone {
		c.flush(0)
		c.node = plan.Node{Name: node.Name, Zone: node.Zone}
	}
	r := &run{c: c, ctx: ctx, full: full, cur: out, done: make([]bool, len(out)), failed: make([]bool, len(out)),
		cached: make([]int, len(c.slots))}
	for _, s := range c.slots {
		r.slot(s)
	}
	good := 0
	for i, svc := range services {
		if svc != nil && !r.failed[i] {
			c.lastGood[svc.Key] = out[i]
			good++
		}
	}
	if full && r.stale(good) {
		c.prune(services)
	}
	return out, errors.Join(r.errs...)
}

// Forget drops what the chain remembers about the services with these keys.
func (c *Chain) Forget(keys ...plan.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.lastGood, k)
		for _, s := range c.slots {
			delete(s.cache, k)
		}
	}
}

// Close releases every plugin and the compilation cache. Applies after
// Close treat every call as failed.
func (c *Chain) Close(ctx context.Context) error {
	c.loadMu.Lock()
	defer c.loadMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, s := range c.slots {
		if s.p != nil {
			errs = append(errs, s.p.close())
			s.p = nil
		}
	}
	if c.cache != nil {
		errs = append(errs, c.cache.Close(ctx))
	}
	return errors.Join(errs...)
}

// flush empties the caches of the plugins from index from on.
func (c *Chain) flush(from int) {
	for _, s := range c.slots[from:] {
		clear(s.cache)
	}
}

// prune drops what the chain remembers about services not in services.
func (c *Chain) prune(services []*plan.Service) {
	keep := make(map[plan.Key]struct{}, len(services))
	for _, svc := range services {
		if svc != nil {
			keep[svc.Key] = struct{}{}
		}
	}
	for k := range c.lastGood {
		if _, ok := keep[k]; !ok {
			delete(c.lastGood, k)
		}
	}
	for _, s := range c.slots {
		for k := range s.cache {
			if _, ok := keep[k]; !ok {
				delete(s.cache, k)
			}
		}
	}
}

// run is the state of one Apply.
type run struct {
	c      *Chain
	ctx    context.Context
	full   bool
	cur    []*plan.Service // each service's output so far
	done   []bool          // failed under a closed policy: skips the rest of the chain
	failed []bool          // some plugin failed on it: not a last good output
	cached []int           // per plugin: cache entries this Apply used or made
	errs   []error
}

// stale reports whether the chain may remember services that a full Apply
// no longer has: it does when a cache holds more entries than this Apply
// used, or lastGood more than the good outputs it stored.
func (r *run) stale(good int) bool {
	if len(r.c.lastGood) > good {
		return true
	}
	for i, s := range r.c.slots {
		if len(s.cache) > r.cached[i] {
			return true
		}
	}
	return false
}

// slot runs one plugin over the current services.
func (r *run) slot(s *slot) {
	var misses []int
	matching := 0
	for i, svc := range r.cur {
		if svc == nil || r.done[i] || !s.Match.matches(svc) {
			continue
		}
		matching++
		if e, ok := s.cache[svc.Key]; ok && e.in == svc {
			r.cur[i] = e.out
			r.cached[s.index]++
			continue
		}
		misses = append(misses, i)
	}
	switch {
	case len(misses) == 0:
	case r.c.closed:
		r.fail(s, misses, errClosed)
	case s.health.quarantined(r.c.opts.Now()):
		r.fail(s, misses, s.health.err())
	case s.p != nil:
		chunks := chunk(r.cur, misses)
		full := r.full && len(misses) == matching && len(chunks) == 1
		for _, pt := range r.calls(s, chunks, full) {
			r.settle(s, pt)
		}
	}
}

// maxCallEndpoints bounds the endpoints of one call (about 260 KiB of
// batch), so that even a slow plugin (a few µs per endpoint under the
// deadline checks) answers each call well within its timeout; a call's own
// cost is about 0.1 ms.
const maxCallEndpoints = 5000

// chunk splits the services at idx into calls of at most maxCallEndpoints
// endpoints (a service with more gets a call of its own).
func chunk(services []*plan.Service, idx []int) [][]int {
	var out [][]int
	start, n := 0, 0
	for j, i := range idx {
		e := len(services[i].Endpoints) + 1
		if n+e > maxCallEndpoints && j > start {
			out = append(out, idx[start:j])
			start, n = j, 0
		}
		n += e
	}
	if start < len(idx) {
		out = append(out, idx[start:])
	}
	return out
}

// part is one call: the services it carried and what came back.
type part struct {
	idx     []int
	in, out []*plan.Service
	err     error
	took    time.Duration
}

// maxWorkers bounds the calls one plugin runs at once (one instance each),
// so a big sync uses two cores, not the whole node.
const maxWorkers = 2

// calls runs the plugin on every chunk, several at once, and returns one
// part per call in chunk order (a chunk too big for the plugin's memory
// takes several calls).
func (r *run) calls(s *slot, chunks [][]int, full bool) []part {
	parts := make([][]part, len(chunks))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range min(len(chunks), maxWorkers, runtime.GOMAXPROCS(0)) {
		enc := &r.c.encs[w]
		wg.Go(func() {
			for k := int(next.Add(1) - 1); k < len(chunks); k = int(next.Add(1) - 1) {
				parts[k] = r.call(s, enc, chunks[k], full)
			}
		})
	}
	wg.Wait()
	return slices.Concat(parts...)
}

// call encodes the services at idx and sends them, halving the batch while
// it is larger than a quarter of the plugin's memory.
func (r *run) call(s *slot, enc *abi.Encoder, idx []int, full bool) []part {
	in := make([]*plan.Service, len(idx))
	for j, i := range idx {
		in[j] = r.cur[i]
	}
	batch := enc.Encode(r.c.node, in, full)
	if uint64(len(batch)) > s.MemoryLimit/4 && len(idx) > 1 {
		half := len(idx) / 2
		return append(r.call(s, enc, idx[:half], false), r.call(s, enc, idx[half:], false)...)
	}
	start := time.Now()
	out, err := s.p.run(r.ctx, batch, in)
	return []part{{idx: idx, in: in, out: out, err: err, took: time.Since(start)}}
}

// settle adopts one call's outputs, or applies the failure policy and
// counts the failure towards quarantine.
func (r *run) settle(s *slot, pt part) {
	obs := r.c.opts.Observer
	if obs != nil {
		obs.PluginCalled(s.Name, pt.took, pt.err)
	}
	if pt.err != nil {
		r.c.log.Warn("Plugin failed", "plugin", s.Name, "services", len(pt.idx),
			"failurePolicy", s.FailurePolicy, "error", pt.err)
		if r.ctx.Err() == nil {
			r.countFailure(s, pt.err)
		}
		r.fail(s, pt.idx, pt.err)
		return
	}
	if s.health.succeeded() {
		r.c.log.Info("Plugin recovered", "plugin", s.Name)
		if obs != nil {
			obs.PluginQuarantined(s.Name, false)
		}
	}
	r.accept(s, pt.idx, pt.in, pt.out)
}

// countFailure counts a failed call towards the plugin's quarantine and logs
// and reports the quarantine it starts, the first one or the next one
// after a failed trial call.
func (r *run) countFailure(s *slot, err error) {
	again := s.health.backoff > 0
	if !s.health.failed(r.c.opts.Now()) {
		return
	}
	msg := "Quarantining plugin; its failure policy applies to its services until the backoff ends"
	if again {
		msg = "Quarantining plugin again: its trial call after the backoff failed"
	}
	r.c.log.Error(msg, "plugin", s.Name, "until", s.health.until, "backoff", s.health.backoff,
		"failures", s.health.fails, "error", err)
	if obs := r.c.opts.Observer; obs != nil {
		obs.PluginQuarantined(s.Name, true)
	}
}

// accept caches and adopts a plugin's outputs. An output equal to the
// cached one keeps the cached pointer, so later plugins hit their caches.
func (r *run) accept(s *slot, idx []int, in, out []*plan.Service) {
	onChange := r.c.opts.OnChange
	for j, i := range idx {
		o := out[j]
		if e, ok := s.cache[o.Key]; ok && e.out != o && e.out.Equal(o) {
			o = e.out
		}
		s.cache[o.Key] = entry{in: in[j], out: o}
		r.cached[s.index]++
		if onChange != nil && in[j] != o && !in[j].Equal(o) {
			onChange(s.Name, in[j], o)
		}
		r.cur[i] = o
	}
}

// fail applies the plugin's failure policy to the services at idx.
func (r *run) fail(s *slot, idx []int, err error) {
	for _, i := range idx {
		r.failed[i] = true
		if s.FailurePolicy == PolicyClosed {
			r.cur[i] = r.c.lastGood[r.cur[i].Key]
			r.done[i] = true
		}
	}
	r.errs = append(r.errs, &PluginError{Plugin: s.Name, Policy: s.FailurePolicy, Services: len(idx), Err: err})
}
