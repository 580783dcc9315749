package hooks

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// watched starts a chain of one plugin at path and its Watch; OnReload
// signals reloaded.
func watched(t *testing.T, path string, policy Policy) (c *Chain, logs *logBuffer, reloaded chan struct{}) {
	t.Helper()
	reloaded = make(chan struct{}, 10)
	c, logs = newChain(t, Options{OnReload: func() { reloaded <- struct{}{} }},
		Config{Name: "p", Path: path, FailurePolicy: policy})
	watchInBackground(t, c)
	return c, logs, reloaded
}

func readGuest(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(guest(name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// replace writes data to path atomically, as deployment tools do.
func replace(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// until repeats change (the watcher may not be watching yet) until done
// reports success.
func until(t *testing.T, what string, change func(), done func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		change()
		for poll := time.Now().Add(500 * time.Millisecond); time.Now().Before(poll); {
			if done() {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func signalled(ch chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// weightsAfter applies one fresh copy of s and returns its weights.
func weightsAfter(t *testing.T, c *Chain, s *plan.Service) []uint32 {
	t.Helper()
	out, err := apply(c, []*plan.Service{s}, true)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return weights(out[0])
}

func TestWatchReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.wasm")
	replace(t, path, readGuest(t, "noop"))
	c, logs, reloaded := watched(t, path, PolicyClosed)
	alpha := svc("default", "alpha", 2, weightAnnotation, "6")
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{1, 1}) {
		t.Fatalf("noop gave weights %v", w)
	}

	newer := readGuest(t, "reweight")
	until(t, "the reload", func() { replace(t, path, newer) }, signalled(reloaded))
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{6, 6}) {
		t.Errorf("after the reload the same service has weights %v, want the new version's 6s", w)
	}
	if len(logs.lines("Reloaded plugin", "plugin=p", "sha256="+fileSHA(t, guest("reweight")))) != 1 {
		t.Errorf("the reload was not logged with the new sha256")
	}

	corrupt := append(slices.Clone(newer[:1000]), "not wasm"...)
	until(t, "the failed reload", func() { replace(t, path, corrupt) }, func() bool {
		return len(logs.lines("level=ERROR", "Keeping the previous plugin version", "plugin=p")) > 0
	})
	if w := weightsAfter(t, c, with(alpha, "x", "y")); !slices.Equal(w, []uint32{6, 6}) {
		t.Errorf("after a corrupt file the plugin gives weights %v, want the previous version's 6s", w)
	}
	if signalled(reloaded)() {
		t.Errorf("OnReload was called for a file that did not load")
	}
}

// TestWatchConfigMap swaps a ConfigMap-style ..data symlink.
func TestWatchConfigMap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, guestName string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "p.wasm"), readGuest(t, guestName), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "noop")
	link("..v1", "..data")
	link("..data/p.wasm", "p.wasm")
	c, _, reloaded := watched(t, filepath.Join(dir, "p.wasm"), PolicyClosed)
	alpha := svc("default", "alpha", 1, weightAnnotation, "8")
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{1}) {
		t.Fatalf("noop gave weights %v", w)
	}
	version("..v2", "reweight")
	swap := func() {
		_ = os.Remove(filepath.Join(dir, "..data_tmp"))
		link("..v2", "..data_tmp")
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "the reload", swap, signalled(reloaded))
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{8}) {
		t.Errorf("after the swap weights are %v, want 8", w)
	}
}

// TestWatchLateFile shows that an open plugin that could not load starts
// working once its file appears.
func TestWatchLateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.wasm")
	c, _, reloaded := watched(t, path, PolicyOpen)
	alpha := svc("default", "alpha", 1, weightAnnotation, "4")
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{1}) {
		t.Fatalf("an unloaded plugin gave weights %v", w)
	}
	until(t, "the load", func() { replace(t, path, readGuest(t, "reweight")) }, signalled(reloaded))
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{4}) {
		t.Errorf("after the file appeared weights are %v, want 4", w)
	}
}

// watchInBackground runs c.Watch until the test ends, and fails the test
// if it returns an error.
func watchInBackground(t *testing.T, c *Chain) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
}
