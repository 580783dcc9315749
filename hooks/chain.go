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

	secondAfter time.Duration // secondWorkerAfter; tests change it
	noRelay     bool          // encode every batch, for tests
	encoded     atomic.Int64  // batches encoded, for tests
}

// slot is one configured plugin and its per-service cache. Its fields are
// guarded by Chain.mu.
type slot struct {
	*settings
	index     int
	p         *plugin // nil while an open plugin could not be loaded
	cache     map[plan.Key]entry
	health    health
	failedSHA string       // the file version that last failed to reload
	loadErr   error        // why New could not load the plugin, while p is nil
	sig       *signalState // nil for a plugin without signals
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
	c := &Chain{opts: opts, log: opts.Log, lastGood: map[plan.Key]*plan.Service{}, secondAfter: secondWorkerAfter}
	for i, cfg := range plugins {
		s, err := prepare(cfg, opts)
		if err != nil {
			return nil, err
		}
		sl := &slot{settings: s, index: i, cache: map[plan.Key]entry{}}
		if len(s.Signals) > 0 {
			sl.sig = newSignalState()
		}
		c.slots = append(c.slots, sl)
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
			s.loadErr = err
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
		cached: make([]int, len(c.slots)), long: make([]bool, len(c.slots))}
	for _, s := range c.slots {
		r.slot(s)
	}
	c.renew(r)
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
			s.sig.forget(k)
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

// renew has the plugins give back the memory their instances grew by in
// a full Apply, or in a batch long enough for a second worker.
func (c *Chain) renew(r *run) {
	for i, s := range c.slots {
		if s.p != nil && (r.full || r.long[i]) {
			s.p.renew()
		}
	}
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
				s.sig.forget(k)
			}
		}
	}
}
