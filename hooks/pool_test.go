package hooks

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// bigServices returns n services of eps endpoints each, annotated for the
// reweight plugin and the hostile guest.
func bigServices(n, eps int) []*plan.Service {
	out := make([]*plan.Service, n)
	for i := range out {
		out[i] = svc("default", fmt.Sprintf("s%d", i), eps, "w", "2", actAnnotation, "true")
	}
	return out
}

// instances returns the plugin's live and peak instance counts, once no
// fresh instance is being made.
func instances(c *Chain, i int) (live, peak int64) {
	p := c.slots[i].p
	p.settled()
	return p.memories.live.Load(), p.memories.peak.Load()
}

// TestPluginOneInstance shows that a plugin runs a sync of several calls
// on one instance when the batch ends before a second worker would join.
func TestPluginOneInstance(t *testing.T) {
	c, _ := newChain(t, Options{}, reweight("reweight", "w"))
	c.secondAfter = time.Hour
	if _, err := apply(c, bigServices(40, 1000), true); err != nil {
		t.Fatal(err)
	}
	calls, _ := stats(c, "reweight")
	if live, peak := instances(c, 0); calls < 8 || live != 1 || peak != 1 {
		t.Errorf("%d calls on %d instances at most, %d after the sync; want at least 8 calls on one instance",
			calls, peak, live)
	}
}

// TestPluginSecondInstance shows that a second instance joins a batch of
// several calls that is still running after Chain.secondAfter (here at
// once), and that the plugin keeps one instance after it; a batch of one
// call never gets a second.
func TestPluginSecondInstance(t *testing.T) {
	for _, tc := range []struct {
		name     string
		services []*plan.Service
		peak     int64
	}{
		{"several calls", bigServices(40, 1000), 2},
		{"one call", bigServices(2, 1000), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newChain(t, Options{}, reweight("reweight", "w"))
			c.secondAfter = 0
			out, err := apply(c, tc.services, true)
			if err != nil {
				t.Fatal(err)
			}
			assertSubset(t, tc.services, out)
			if live, peak := instances(c, 0); live != 1 || peak != tc.peak {
				t.Errorf("%d instances at most, %d after the sync; want %d, then 1", peak, live, tc.peak)
			}
		})
	}
}

// TestLonger shows when a batch counts as long: when its first worker is
// still running after Chain.secondAfter.
func TestLonger(t *testing.T) {
	done := make(chan struct{})
	close(done)
	r := &run{c: &Chain{secondAfter: time.Hour}}
	if r.longer(done) {
		t.Error("a batch that ended at once is long")
	}
	r.c.secondAfter = time.Nanosecond
	if !r.longer(make(chan struct{})) {
		t.Error("a batch still running after its threshold is not long")
	}
}

// TestPluginRenew shows that an instance grown by a full sync is replaced
// by a fresh one, at its size once started, and that a short partial sync
// keeps it; a call that comes while the fresh instance starts waits for it
// rather than starting another.
func TestPluginRenew(t *testing.T) {
	c, _ := newChain(t, Options{}, Config{Name: "hog", Path: guest("hostile"), Config: map[string]any{"mode": "hog"}})
	p := c.slots[0].p
	idle := func() *instance {
		p.settled()
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.idle) != 1 {
			t.Fatalf("%d idle instances, want 1", len(p.idle))
		}
		return p.idle[0]
	}
	first := idle()
	services := bigServices(3, 2)
	if _, err := apply(c, services[:1], false); err != nil {
		t.Fatal(err)
	}
	if inst := idle(); inst != first || !inst.grown() {
		t.Fatalf("after a partial sync the instance is %p (grown: %v), want %p, grown", inst, inst.grown(), first)
	}
	if _, err := apply(c, services, true); err != nil {
		t.Fatal(err)
	}
	changed := []*plan.Service{with(services[1], "x", "y")} // not cached: a call while the fresh instance starts
	if _, err := apply(c, changed, false); err != nil {
		t.Fatal(err)
	}
	if calls, _ := stats(c, "hog"); calls != 3 {
		t.Fatalf("%d calls, want 3", calls)
	}
	if inst := idle(); inst == first {
		t.Error("the grown instance was kept after a full sync")
	}
	if live, peak := instances(c, 0); live != 1 || peak != 1 {
		t.Errorf("%d instances at most, %d at the end; want 1 all along", peak, live)
	}
	if _, err := apply(c, services, true); err != nil {
		t.Fatal(err)
	}
	if inst := idle(); inst.mem.Size() != first.started {
		t.Errorf("after a full sync the instance has %d KiB of memory, a fresh one %d KiB", inst.mem.Size()>>10, first.started>>10)
	}
}

// TestPluginBatchBuffer shows that an instance gets its batches in the
// buffer it got the first one in, as long as they fit, and then in a
// larger one.
func TestPluginBatchBuffer(t *testing.T) {
	c, logs := newChain(t, Options{}, Config{Name: "where", Path: guest("hostile"), Config: map[string]any{"mode": "where"}})
	c.secondAfter = time.Hour
	for _, s := range []*plan.Service{svc("a", "small", 3), svc("a", "tiny", 1), svc("a", "big", 2000), svc("a", "small", 3)} {
		if _, err := apply(c, []*plan.Service{s}, false); err != nil {
			t.Fatal(err)
		}
	}
	re := regexp.MustCompile(`batch at=(\d+) len=(\d+)`)
	var at []string
	for _, l := range logs.lines("plugin=where", "line=") {
		if m := re.FindStringSubmatch(l); m != nil {
			at = append(at, m[1])
		}
	}
	if len(at) != 4 || at[0] != at[1] || at[2] == at[1] || at[3] != at[2] {
		t.Errorf("batches at %v, want the first two at one address and the next two at another", at)
	}
}
