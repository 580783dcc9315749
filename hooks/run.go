package hooks

import (
	"context"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// run is the state of one Apply.
type run struct {
	c       *Chain
	ctx     context.Context
	full    bool
	cur     []*plan.Service // each service's output so far
	done    []bool          // failed under a closed policy: skips the rest of the chain
	failed  []bool          // some plugin failed on it: not a last good output
	cached  []int           // per plugin: cache entries this Apply used or made
	long    []bool          // per plugin: a batch ran long enough for a second worker
	relayed []chunk         // the last plugin calls' outputs, as batches for the next plugin
	errs    []error
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
		if e, ok := s.cache[svc.Key]; ok && e.in == svc && !s.sig.stale(svc.Key) {
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
		chunks := r.chunks(s, misses)
		full := r.full && len(misses) == matching && len(chunks) == 1
		parts := r.calls(s, chunks, full)
		r.relayed = nil
		for _, pt := range parts {
			r.settle(s, pt)
			if pt.err == nil && pt.next != nil {
				r.relayed = append(r.relayed, chunk{idx: pt.idx, batch: pt.next, svcs: r.at(pt.idx)})
			}
		}
	}
}

// at returns the current services at idx.
func (r *run) at(idx []int) []*plan.Service {
	out := make([]*plan.Service, len(idx))
	for j, i := range idx {
		out[j] = r.cur[i]
	}
	return out
}

// chunk is the services at idx, sent in one call unless too big for the
// plugin's memory. batch, when not nil, already holds them, as a previous
// plugin's call relayed them: svcs are the services it holds.
type chunk struct {
	idx   []int
	batch []byte
	svcs  []*plan.Service
}

// chunks splits the services at idx into calls: the batches the last
// plugin calls relayed when they hold exactly these services, in this
// order (a failed call relays nothing); otherwise calls of at most
// maxCallEndpoints endpoints, encoded when they are made.
func (r *run) chunks(s *slot, idx []int) []chunk {
	if s.sig == nil && r.carries(idx) { // relayed batches are of version 1
		return r.relayed
	}
	var out []chunk
	for _, c := range split(r.cur, idx) {
		out = append(out, chunk{idx: c})
	}
	return out
}

// carries reports whether the relayed batches hold exactly the current
// services at idx, in order.
func (r *run) carries(idx []int) bool {
	n := 0
	for _, c := range r.relayed {
		for j, i := range c.idx {
			if n == len(idx) || idx[n] != i || r.cur[i] != c.svcs[j] {
				return false
			}
			n++
		}
	}
	return n > 0 && n == len(idx)
}

// maxCallEndpoints bounds the endpoints of one call (about 260 KiB of
// batch), so that even a slow plugin (a few µs per endpoint under the
// deadline checks) answers each call well within its timeout; a call's own
// cost is about 0.1 ms.
const maxCallEndpoints = 5000

// split splits the services at idx into calls of at most maxCallEndpoints
// endpoints (a service with more gets a call of its own).
func split(services []*plan.Service, idx []int) [][]int {
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

// part is one call: the services it carried and what came back; next is
// the batch relaying the outputs to the next plugin, or nil.
type part struct {
	idx     []int
	in, out []*plan.Service
	next    []byte
	err     error
	took    time.Duration
}

// maxWorkers bounds the calls one plugin runs at once (one instance each),
// so a big sync uses two cores, not the whole node.
const maxWorkers = 2

// secondWorkerAfter is how long a plugin's batch runs on one instance
// before a second worker, on a second instance, joins it: making an
// instance takes some 15 ms, which pays off only for a long batch (a full
// sync of thousands of services), and the instance is closed at its end.
const secondWorkerAfter = 20 * time.Millisecond

// worker makes calls one after the other on one instance of a plugin.
type worker struct {
	enc  *abi.Encoder
	inst *instance // nil until the first call, and after a failed one
}

// calls runs the plugin on every chunk and returns one part per call in
// chunk order (a chunk too big for the plugin's memory takes several
// calls). A first worker starts at once; while chunks remain after
// Chain.secondAfter, a second one joins on a second instance.
func (r *run) calls(s *slot, chunks []chunk, full bool) []part {
	parts := make([][]part, len(chunks))
	var next atomic.Int64
	work := func(w *worker) {
		for k := int(next.Add(1) - 1); k < len(chunks); k = int(next.Add(1) - 1) {
			parts[k] = r.call(s, w, chunks[k], full)
		}
		if w.inst != nil {
			s.p.put(w.inst)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		work(&worker{enc: &r.c.encs[0]})
	}()
	if len(chunks) > 1 && min(maxWorkers, runtime.GOMAXPROCS(0)) > 1 && r.longer(done) &&
		next.Load() < int64(len(chunks)) {
		r.long[s.index] = true
		if inst, err := s.p.get(r.ctx); err == nil { // else the first worker carries on alone
			work(&worker{enc: &r.c.encs[1], inst: inst})
		}
	}
	<-done
	return slices.Concat(parts...)
}

// longer reports whether the batch whose first worker closes done is
// still running after Chain.secondAfter.
func (r *run) longer(done <-chan struct{}) bool {
	if r.c.secondAfter <= 0 {
		return true
	}
	t := time.NewTimer(r.c.secondAfter)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// call sends the services of c, halving the batch while it is larger than
// a quarter of the plugin's memory. It relays the outputs when a later
// plugin may take them.
func (r *run) call(s *slot, w *worker, c chunk, full bool) []part {
	in := r.at(c.idx)
	batch := c.batch
	if batch != nil && uint64(len(batch)) > s.MemoryLimit/4 && len(c.idx) > 1 {
		batch = nil
	}
	var next []byte
	if batch == nil {
		if s.sig != nil {
			batch = w.enc.EncodeSignals(r.c.node, in, full, s.signalsOf(in))
		} else {
			batch = w.enc.Encode(r.c.node, in, full)
		}
		r.c.encoded.Add(1)
		if uint64(len(batch)) > s.MemoryLimit/4 && len(c.idx) > 1 {
			half := len(c.idx) / 2
			return append(r.call(s, w, chunk{idx: c.idx[:half]}, false), r.call(s, w, chunk{idx: c.idx[half:]}, false)...)
		}
		if r.relays(s) {
			next = make([]byte, len(batch))
		}
	} else {
		setFull(batch, full)
		if r.relays(s) {
			next = batch
		}
	}
	start := time.Now()
	out, next, err := s.p.run(r.ctx, &w.inst, batch, in, next)
	return []part{{idx: c.idx, in: in, out: out, next: next, err: err, took: time.Since(start)}}
}

// relays reports whether the outputs of s are worth relaying: a plugin
// after it may take them. Batches with signals (version 2) are neither
// relayed nor taken from a relay.
func (r *run) relays(s *slot) bool {
	return !r.c.noRelay && s.sig == nil && s.index < len(r.c.slots)-1 && r.c.slots[s.index+1].sig == nil
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
		s.sig.sent(o.Key)
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
