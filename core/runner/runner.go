// Package runner decides when Weir syncs: soon after a change but never more
// often than the minimum period, a full resync at least every sync period,
// and retries with exponential backoff after a failure.
package runner

import (
	"context"
	"time"
)

// Clock is the time source; tests inject a fake one.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// SyncFunc performs one sync; full asks for everything to be rewritten.
type SyncFunc func(ctx context.Context, full bool) error

// Options configures a Runner.
type Options struct {
	// MinInterval is the least time between the starts of two syncs.
	MinInterval time.Duration
	// MaxInterval is the most time between two full syncs.
	MaxInterval time.Duration
	// Clock defaults to the real clock.
	Clock Clock
}

// Runner calls a SyncFunc on a bounded-frequency schedule.
type Runner struct {
	sync    SyncFunc
	opts    Options
	trigger chan struct{}
}

// New returns a runner for fn; the first sync it runs is a full one.
func New(fn SyncFunc, opts Options) *Runner {
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.MaxInterval <= 0 {
		opts.MaxInterval = 30 * time.Second
	}
	return &Runner{sync: fn, opts: opts, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a sync as soon as the minimum interval allows. It never
// blocks; several triggers before a sync collapse into one.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// schedule is the runner's state between syncs.
type schedule struct {
	pending  bool      // a change is waiting
	full     bool      // the next sync must be full
	lastRun  time.Time // start of the previous sync
	nextFull time.Time // when the periodic full sync is due
	retryAt  time.Time // earliest retry after a failure
	backoff  time.Duration
}

// Run syncs until ctx is done. It starts with a full sync at once.
func (r *Runner) Run(ctx context.Context) {
	now := r.opts.Clock.Now()
	s := schedule{pending: true, full: true, nextFull: now}
	for {
		wait := r.wait(&s, r.opts.Clock.Now())
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.trigger:
				s.pending = true
				continue
			case <-r.opts.Clock.After(wait):
			}
		}
		if ctx.Err() != nil {
			return
		}
		r.runOnce(ctx, &s)
	}
}

// wait returns how long to wait before the next sync is due. Every sync,
// the periodic full one included, starts at least MinInterval after the
// previous one.
func (r *Runner) wait(s *schedule, now time.Time) time.Duration {
	due := s.nextFull
	if s.pending {
		due = s.retryAt // zero, so as soon as allowed, unless a sync failed
	}
	if earliest := s.lastRun.Add(r.opts.MinInterval); due.Before(earliest) {
		due = earliest
	}
	return due.Sub(now)
}

func (r *Runner) runOnce(ctx context.Context, s *schedule) {
	now := r.opts.Clock.Now()
	full := s.full || !now.Before(s.nextFull)
	// Drain a trigger that arrived meanwhile: this sync covers it.
	select {
	case <-r.trigger:
	default:
	}
	s.lastRun = now
	if err := r.sync(ctx, full); err != nil {
		s.pending, s.full = true, true
		s.backoff = min(max(2*s.backoff, max(r.opts.MinInterval, time.Second)), r.opts.MaxInterval)
		s.retryAt = now.Add(s.backoff)
		return
	}
	s.pending, s.full, s.backoff, s.retryAt = false, false, 0, time.Time{}
	if full {
		s.nextFull = now.Add(r.opts.MaxInterval)
	}
}
