package runner_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/runner"
)

const (
	minInterval = time.Second
	maxInterval = 30 * time.Second
)

var errSync = errors.New("sync failed")

// call is one recorded sync: when (offset from t0) and whether it was full.
type call struct {
	at   time.Duration
	full bool
}

// fakeSync records every sync on a channel and returns errors from a script;
// once the script runs out, syncs succeed.
type fakeSync struct {
	clock *fakeClock
	calls chan call
	mu    sync.Mutex
	errs  []error
	// during, if set, runs inside the sync, e.g. to trigger meanwhile.
	during func()
}

func (f *fakeSync) sync(ctx context.Context, full bool) error {
	f.calls <- call{since(f.clock.Now()), full}
	if f.during != nil {
		f.during()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

// harness runs a Runner on a fake clock in the background.
type harness struct {
	t      *testing.T
	clock  *fakeClock
	syncs  *fakeSync
	runner *runner.Runner
}

// start runs a runner with the given intervals; script lists the results of
// the first syncs. The runner is stopped when the test ends.
func start(t *testing.T, minI, maxI time.Duration, script ...error) *harness {
	t.Helper()
	h := newHarness(t, minI, maxI, script...)
	h.run(t.Context())
	return h
}

func newHarness(t *testing.T, minI, maxI time.Duration, script ...error) *harness {
	clock := newFakeClock()
	syncs := &fakeSync{clock: clock, calls: make(chan call, 100), errs: script}
	r := runner.New(syncs.sync, runner.Options{MinInterval: minI, MaxInterval: maxI, Clock: clock})
	return &harness{t: t, clock: clock, syncs: syncs, runner: r}
}

// run starts Run in the background; the test's end cancels it and waits
// for it to return.
func (h *harness) run(parent context.Context) (cancel context.CancelFunc, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(parent)
	d := make(chan struct{})
	go func() {
		defer close(d)
		h.runner.Run(ctx)
	}()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-d:
		case <-time.After(realTimeout):
			h.t.Errorf("Run did not return within %v of cancel", realTimeout)
		}
	})
	return cancel, d
}

// expectSync waits for the next sync and checks its time and kind.
func (h *harness) expectSync(at time.Duration, full bool) {
	h.t.Helper()
	select {
	case c := <-h.syncs.calls:
		if c.at != at || c.full != full {
			h.t.Fatalf("sync at %v full=%v, want at %v full=%v", c.at, c.full, at, full)
		}
	case <-time.After(realTimeout):
		h.t.Fatalf("no sync within %v; want one at %v full=%v", realTimeout, at, full)
	}
}

// expectNoSync checks that no sync was recorded. Call it when the runner is
// known to be waiting on the clock, so none can be in flight.
func (h *harness) expectNoSync() {
	h.t.Helper()
	select {
	case c := <-h.syncs.calls:
		h.t.Fatalf("unexpected sync at %v full=%v", c.at, c.full)
	default:
	}
}

// expectWait waits until the runner blocks on the clock until t0+until.
func (h *harness) expectWait(until time.Duration) {
	h.t.Helper()
	h.clock.waitsUntil(h.t, until)
}

// at advances the fake clock to t0+d.
func (h *harness) at(d time.Duration) {
	h.t.Helper()
	h.clock.advanceTo(h.t, t0.Add(d))
}

func TestFirstSyncIsFullAndImmediate(t *testing.T) {
	h := start(t, minInterval, maxInterval)
	h.expectSync(0, true)
	h.expectWait(maxInterval)
	h.expectNoSync()
}

func TestTriggersWithinMinIntervalCoalesce(t *testing.T) {
	h := start(t, minInterval, maxInterval)
	h.expectSync(0, true)
	h.expectWait(30 * time.Second)

	h.at(200 * time.Millisecond)
	h.runner.Trigger()
	h.expectWait(time.Second) // lastRun + MinInterval
	h.at(500 * time.Millisecond)
	h.runner.Trigger()
	h.runner.Trigger() // collapses with the one above
	h.expectWait(time.Second)
	h.at(999 * time.Millisecond)
	h.expectNoSync()

	h.at(time.Second)
	h.expectSync(time.Second, false)
	h.expectWait(30 * time.Second) // the periodic full sync is still due at 30s
	h.expectNoSync()
}

func TestTriggerAfterMinIntervalSyncsAtOnce(t *testing.T) {
	h := start(t, minInterval, maxInterval)
	h.expectSync(0, true)
	h.expectWait(30 * time.Second)
	h.at(5 * time.Second)
	h.runner.Trigger()
	h.expectSync(5*time.Second, false)
	h.expectWait(30 * time.Second)
}

func TestTriggerDuringSyncIsNotLost(t *testing.T) {
	h := newHarness(t, minInterval, maxInterval)
	first := true
	h.syncs.during = func() {
		if first { // a change arrives while the first sync runs
			first = false
			h.runner.Trigger()
		}
	}
	h.run(t.Context())
	h.expectSync(0, true)
	h.expectWait(time.Second)
	h.at(time.Second)
	h.expectSync(time.Second, false)
	h.expectWait(30 * time.Second)
}

func TestPeriodicFullSync(t *testing.T) {
	h := start(t, minInterval, maxInterval)
	h.expectSync(0, true)
	for i := 1; i <= 4; i++ {
		due := time.Duration(i) * maxInterval
		h.expectWait(due)
		h.at(due - time.Millisecond)
		h.expectNoSync()
		h.at(due)
		h.expectSync(due, true)
	}
}

func TestPeriodicFullSyncAfterPartial(t *testing.T) {
	// A partial sync does not postpone the periodic full one.
	h := start(t, minInterval, maxInterval)
	h.expectSync(0, true)
	h.expectWait(30 * time.Second)
	h.at(10 * time.Second)
	h.runner.Trigger()
	h.expectSync(10*time.Second, false)
	h.expectWait(30 * time.Second)
	h.at(30 * time.Second)
	h.expectSync(30*time.Second, true)
	h.expectWait(60 * time.Second)
}

// TestMinIntervalBoundsPeriodicSync checks that the periodic full sync also
// keeps MinInterval after the previous sync's start, like kube-proxy's
// bounded-frequency runner: it is postponed, not run early.
func TestMinIntervalBoundsPeriodicSync(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		h := start(t, minInterval, maxInterval)
		h.expectSync(0, true)
		h.expectWait(30 * time.Second)
		h.at(29500 * time.Millisecond)
		h.runner.Trigger()
		h.expectSync(29500*time.Millisecond, false)
		h.expectWait(30500 * time.Millisecond)
		h.at(30 * time.Second)
		h.expectNoSync()
		h.at(30500 * time.Millisecond)
		h.expectSync(30500*time.Millisecond, true)
		h.expectWait(60500 * time.Millisecond)
	})
	t.Run("pending", func(t *testing.T) {
		h := start(t, minInterval, maxInterval)
		h.expectSync(0, true)
		h.expectWait(30 * time.Second)
		h.at(29500 * time.Millisecond)
		h.runner.Trigger()
		h.expectSync(29500*time.Millisecond, false)
		h.expectWait(30500 * time.Millisecond)
		h.at(29700 * time.Millisecond)
		h.runner.Trigger()
		h.expectWait(30500 * time.Millisecond)
		h.at(30 * time.Second)
		h.expectNoSync()
		h.at(30500 * time.Millisecond)
		h.expectSync(30500*time.Millisecond, true) // one sync covers both
		h.expectWait(60500 * time.Millisecond)
		h.expectNoSync()
	})
}

func TestFailureBackoff(t *testing.T) {
	const maxI = 10 * time.Second
	h := start(t, minInterval, maxI,
		nil,                                              // 0s: first full sync
		errSync,                                          // 2s: partial sync fails
		errSync, errSync, errSync, errSync, errSync, nil, // retries
		errSync, // 40s: fails again
	)
	h.expectSync(0, true)
	h.expectWait(10 * time.Second)

	h.at(2 * time.Second)
	h.runner.Trigger()
	h.expectSync(2*time.Second, false) // fails
	h.expectWait(3 * time.Second)      // backoff 1s

	// A trigger during the backoff neither advances nor delays the retry.
	h.at(2500 * time.Millisecond)
	h.runner.Trigger()
	h.expectWait(3 * time.Second)

	// Each retry is full; the backoff doubles up to MaxInterval.
	at := 3 * time.Second
	for _, backoff := range []time.Duration{2, 4, 8, 10, 10} {
		h.at(at)
		h.expectSync(at, true) // fails
		at += backoff * time.Second
		h.expectWait(at)
		h.at(at - time.Millisecond)
		h.expectNoSync()
	}
	if at != 37*time.Second {
		t.Fatalf("test arithmetic: last retry at %v", at)
	}

	// The retry at 37s succeeds; the periodic full sync counts from it.
	h.at(at)
	h.expectSync(at, true)
	h.expectWait(47 * time.Second)
	h.expectNoSync()

	// The next failure starts over from 1s.
	h.at(40 * time.Second)
	h.runner.Trigger()
	h.expectSync(40*time.Second, false)
	h.expectWait(41 * time.Second)
	h.at(41 * time.Second)
	h.expectSync(41*time.Second, true)
	h.expectWait(51 * time.Second)
}

func TestFirstSyncFails(t *testing.T) {
	h := start(t, 0, maxInterval, errSync, errSync)
	h.expectSync(0, true)
	h.expectWait(time.Second) // at least 1s even with no MinInterval
	h.at(time.Second)
	h.expectSync(time.Second, true)
	h.expectWait(3 * time.Second)
	h.at(3 * time.Second)
	h.expectSync(3*time.Second, true)
	h.expectWait(33 * time.Second)
}

func TestBackoffStartsAtMinInterval(t *testing.T) {
	// With a MinInterval above 1s, retries keep at least MinInterval apart.
	h := start(t, 5*time.Second, time.Minute, errSync, errSync)
	h.expectSync(0, true)
	h.expectWait(5 * time.Second)
	h.at(5 * time.Second)
	h.expectSync(5*time.Second, true)
	h.expectWait(15 * time.Second)
}

func TestRunReturnsOnCancel(t *testing.T) {
	t.Run("while waiting", func(t *testing.T) {
		h := newHarness(t, minInterval, maxInterval)
		cancel, done := h.run(t.Context())
		h.expectSync(0, true)
		h.expectWait(30 * time.Second)
		cancel()
		select {
		case <-done:
		case <-time.After(realTimeout):
			t.Fatal("Run did not return after cancel")
		}
		h.expectNoSync()
	})
	t.Run("before the first sync", func(t *testing.T) {
		h := newHarness(t, minInterval, maxInterval)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, done := h.run(ctx)
		select {
		case <-done:
		case <-time.After(realTimeout):
			t.Fatal("Run did not return with a cancelled context")
		}
		h.expectNoSync()
	})
	t.Run("during a sync", func(t *testing.T) {
		h := newHarness(t, minInterval, maxInterval)
		ctx, cancel := context.WithCancel(t.Context())
		h.syncs.during = cancel // the sync fails because the context ends
		h.syncs.errs = []error{context.Canceled}
		_, done := h.run(ctx)
		h.expectSync(0, true)
		select {
		case <-done:
		case <-time.After(realTimeout):
			t.Fatal("Run did not return after cancel during a sync")
		}
		h.expectNoSync()
	})
}

func TestTriggerNeverBlocks(t *testing.T) {
	r := runner.New(func(context.Context, bool) error { return nil }, runner.Options{})
	for range 100 {
		r.Trigger() // no Run: must not block
	}
}

func TestRealClock(t *testing.T) {
	// With the default clock the first sync still comes at once, and the
	// sync receives Run's context.
	type key struct{}
	got := make(chan bool, 10)
	r := runner.New(func(ctx context.Context, full bool) error {
		if ctx.Value(key{}) != "v" {
			t.Error("sync did not get Run's context")
		}
		got <- full
		return nil
	}, runner.Options{MinInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "v"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	select {
	case full := <-got:
		if !full {
			t.Error("first sync is not full")
		}
	case <-time.After(realTimeout):
		t.Fatal("no first sync with the real clock")
	}
	cancel()
	<-done
}
