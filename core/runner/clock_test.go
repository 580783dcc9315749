package runner_test

import (
	"sync"
	"testing"
	"time"
)

// realTimeout bounds every wait on the runner goroutine in real time. It is
// a failure deadline, never a way to let something happen.
const realTimeout = 5 * time.Second

// t0 is the fake clock's start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a runner.Clock whose time moves only when the test advances
// it. Channels from After fire once the fake time reaches their deadline.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter
	calls   int       // After calls so far
	seen    int       // After calls the test has observed through blocked
	last    time.Time // deadline of the latest After call
}

type waiter struct {
	deadline time.Time
	ch       chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := &waiter{deadline: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.calls++
	c.last = w.deadline
	if d <= 0 {
		w.ch <- c.now
	} else {
		c.waiters = append(c.waiters, w)
	}
	return w.ch
}

// advanceTo moves the fake time forward to t and fires every channel whose
// deadline has passed.
func (c *fakeClock) advanceTo(t *testing.T, to time.Time) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if to.Before(c.now) {
		t.Fatalf("fake clock cannot go back from %v to %v", since(c.now), since(to))
	}
	c.now = to
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.deadline.After(to) {
			kept = append(kept, w)
		} else {
			w.ch <- to
		}
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}

// waitsUntil waits until the runner, since the previous call of waitsUntil,
// has called After with a deadline of t0+want, and fails the test if it does
// not within realTimeout (reporting the deadline it waits for instead). Call
// it after every action that makes the runner wait anew (a sync, a Trigger),
// so that it never matches an older call. The runner selects on the channel
// right after calling After, so once this returns, advancing the clock to the
// deadline wakes it, and until then the runner is idle.
//
// Polling, not the first new call, because the runner may call After more
// than once on its way to waiting: a trigger that is already queued makes it
// recompute its deadline at once.
func (c *fakeClock) waitsUntil(t *testing.T, want time.Duration) {
	t.Helper()
	deadline := time.Now().Add(realTimeout)
	for {
		c.mu.Lock()
		fresh, last := c.calls > c.seen, c.last
		if fresh && last.Equal(t0.Add(want)) {
			c.seen = c.calls
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			if !fresh {
				t.Fatalf("runner did not wait on the clock within %v; want it to wait until %v", realTimeout, want)
			}
			t.Fatalf("runner waits until %v, want %v", since(last), want)
		}
		time.Sleep(time.Millisecond) // poll interval, not synchronisation
	}
}

// since formats a fake time as an offset from t0.
func since(t time.Time) time.Duration { return t.Sub(t0) }
