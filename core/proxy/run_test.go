package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/runner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

// fast syncs on every change and never on a timer during a test.
var fast = runner.Options{MinInterval: 0, MaxInterval: time.Hour}

// running is a Proxy.Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// startRun runs p until the test ends or stop is called.
func startRun(t *testing.T, p *proxy.Proxy, src source.Source, opts runner.Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx, src, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case _ = <-r.done: // Run's error after a cancel is not this cleanup's concern
		case <-time.After(wait):
			t.Errorf("Run did not return within %s of the end of the test", wait)
		}
	})
	return r
}

// result waits for Run to return.
func (r *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(wait):
		t.Fatalf("Run did not return within %s", wait)
		return nil
	}
}

func TestRunSyncsFullThenPartial(t *testing.T) {
	p, be, logs := newProxy(t)
	c := newCluster()
	src := newFakeSource(func(h source.Handler) {
		h.OnNode(nil, node("n1"))
		h.OnService(nil, c.web)
		h.OnService(nil, c.db)
		h.OnEndpointSlice(nil, c.webEPs)
	})
	r := startRun(t, p, src, fast)

	first := be.next(t)
	if !first.full() {
		t.Fatalf("first sync passed changed=%v, want a full sync", first.changed)
	}
	if got := first.plan.String(); got != clusterPlan {
		t.Errorf("first sync's plan:\n%s\nwant:\n%s", got, clusterPlan)
	}

	src.deliver(t, func(h source.Handler) {
		h.OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.13"))
	})
	second := be.next(t)
	if want := []plan.Key{key("web", "http"), key("web", "metrics")}; second.full() || !sameKeys(second.changed, want) {
		t.Errorf("sync after a change passed changed=%v, want %v", second.changed, want)
	}

	src.deliver(t, func(h source.Handler) { h.OnService(c.db, nil) })
	third := be.next(t)
	if want := []plan.Key{key("db", "sql")}; third.full() || !sameKeys(third.changed, want) {
		t.Errorf("sync after a deletion passed changed=%v, want %v", third.changed, want)
	}
	if r := withPrefix(logs.take(), "Removing service"); len(r) != 1 {
		t.Errorf(`want one "Removing service" record, got:%s`, logged(r))
	}

	r.cancel()
	if err := r.result(t); err != nil {
		t.Errorf("Run after cancel: %v, want nil", err)
	}
	if !closed(src.stopped) {
		t.Errorf("the source did not stop after the context was cancelled")
	}
	if n := be.count(); n != 3 {
		t.Errorf("backend called %d times, want 3", n)
	}
}

func TestRunWaitsForInitialSync(t *testing.T) {
	p, be, _ := newProxy(t)
	c := newCluster()
	src := newFakeSource(func(h source.Handler) {
		h.OnService(nil, c.web)
		h.OnEndpointSlice(nil, c.webEPs)
	})
	src.noSync = true
	r := startRun(t, p, src, fast)
	if !closed(src.started) {
		t.Fatal("source never started")
	}
	// More objects before OnSynced: still no sync.
	src.deliver(t, func(h source.Handler) { h.OnService(nil, c.db) })
	if n := be.count(); n != 0 {
		t.Fatalf("backend called %d times before the source's initial sync", n)
	}
	src.deliver(t, func(h source.Handler) { h.OnSynced() })
	first := be.next(t)
	if !first.full() || len(first.plan.Services) != 3 {
		t.Errorf("first sync: changed=%v with %d services, want full with 3", first.changed, len(first.plan.Services))
	}
	r.cancel()
	if err := r.result(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestRunCancelledBeforeInitialSync(t *testing.T) {
	p, be, _ := newProxy(t)
	src := newFakeSource(nil)
	src.noSync = true
	r := startRun(t, p, src, fast)
	if !closed(src.started) {
		t.Fatal("source never started")
	}
	r.cancel()
	if err := r.result(t); err != nil {
		t.Errorf("Run cancelled before the initial sync: %v, want nil", err)
	}
	if n := be.count(); n != 0 {
		t.Errorf("backend called %d times", n)
	}
}

func TestRunReturnsSourceError(t *testing.T) {
	broken := errors.New("watch broke")
	t.Run("after the initial sync", func(t *testing.T) {
		p, be, _ := newProxy(t)
		src := newFakeSource(nil)
		r := startRun(t, p, src, fast)
		be.next(t)
		src.failWith(t, broken)
		if err := r.result(t); !errors.Is(err, broken) {
			t.Errorf("Run: %v, want %v", err, broken)
		}
	})
	t.Run("source stops by itself after the initial sync", func(t *testing.T) {
		p, be, _ := newProxy(t)
		src := newFakeSource(nil)
		r := startRun(t, p, src, fast)
		be.next(t)
		src.failWith(t, nil) // the source returns nil with its context still live
		if err := r.result(t); err == nil {
			t.Error("Run: nil, want an error: the proxy can no longer follow changes")
		}
	})
	t.Run("before the initial sync", func(t *testing.T) {
		p, be, _ := newProxy(t)
		src := sourceFunc(func(context.Context, source.Handler) error { return broken })
		r := startRun(t, p, src, fast)
		if err := r.result(t); !errors.Is(err, broken) {
			t.Errorf("Run: %v, want %v", err, broken)
		}
		if n := be.count(); n != 0 {
			t.Errorf("backend called %d times", n)
		}
	})
	t.Run("source stops by itself before the initial sync", func(t *testing.T) {
		p, _, _ := newProxy(t)
		src := sourceFunc(func(context.Context, source.Handler) error { return nil })
		r := startRun(t, p, src, fast)
		err := r.result(t)
		if err == nil || strings.Contains(err.Error(), "%!") {
			t.Errorf("Run: %v, want an error saying the source stopped", err)
		}
	})
}

func TestRunRetriesFailedSyncInFull(t *testing.T) {
	p, be, logs := newProxy(t)
	c := newCluster()
	be.failNextSync(errors.New("boom"))
	src := newFakeSource(func(h source.Handler) {
		h.OnService(nil, c.web)
		h.OnEndpointSlice(nil, c.webEPs)
	})
	r := startRun(t, p, src, fast)
	if first := be.next(t); first.err == nil {
		t.Fatal("first sync did not fail")
	}
	// The runner backs off (a second at least), then retries in full.
	retry := be.next(t)
	if retry.err != nil || !retry.full() || len(retry.plan.Services) != 2 {
		t.Errorf("retry: err=%v changed=%v services=%d, want a full sync of 2 services",
			retry.err, retry.changed, len(retry.plan.Services))
	}
	if f := withPrefix(logs.take(), "Failed to execute"); len(f) != 1 {
		t.Errorf(`want one "Failed to execute" record, got:%s`, logged(f))
	}
	r.cancel()
	if err := r.result(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestLoadOnce(t *testing.T) {
	p, be, _ := newProxy(t)
	c := newCluster()
	src := newFakeSource(func(h source.Handler) {
		h.OnNode(nil, node("n1"))
		h.OnService(nil, c.web)
		h.OnService(nil, c.db)
		h.OnEndpointSlice(nil, c.webEPs)
	})
	done := make(chan error, 1)
	go func() { done <- p.LoadOnce(context.Background(), src) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("LoadOnce: %v", err)
		}
	case <-time.After(wait):
		t.Fatalf("LoadOnce did not return within %s", wait)
	}
	// LoadOnce waits for the source to return: it has stopped already.
	select {
	case <-src.stopped:
	default:
		t.Error("LoadOnce returned while the source was still running")
	}
	if n := be.count(); n != 0 {
		t.Errorf("LoadOnce called the backend %d times; it only loads", n)
	}
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if got := be.last(t).plan.String(); got != clusterPlan {
		t.Errorf("plan after LoadOnce:\n%s\nwant:\n%s", got, clusterPlan)
	}
}

func TestLoadOnceSourceFailure(t *testing.T) {
	broken := errors.New("no such directory")
	tests := []struct {
		name string
		src  source.Source
		want func(error) bool
	}{
		{"error", sourceFunc(func(context.Context, source.Handler) error { return broken }),
			func(err error) bool { return errors.Is(err, broken) }},
		{"stops without syncing", sourceFunc(func(context.Context, source.Handler) error { return nil }),
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "initial sync") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _, _ := newProxy(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := p.LoadOnce(ctx, tt.src); !tt.want(err) {
				t.Errorf("LoadOnce: %v", err)
			}
		})
	}
}
