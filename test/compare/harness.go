package compare

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/weirproxy/weir/test/e2e/controlplane"
)

// StartControlPlane starts the test control plane (test/e2e/controlplane)
// for a program rather than a test, its files under dir; stop stops it and
// removes them. logf receives its progress lines.
func StartControlPlane(dir string, logf func(format string, args ...any)) (cp *controlplane.ControlPlane, stop func(), err error) {
	t := &programT{dir: dir, logf: logf}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			t.close()
			cp, stop, err = nil, nil, f
		}
	}()
	cp = controlplane.Start(t)
	return cp, t.close, nil
}

// programT is the part of testing.TB the control plane's helpers use:
// Fatal panics with a fatalError, which StartControlPlane recovers, and
// the cleanups run, newest first, at close. The embedded nil testing.TB
// panics on any other method.
type programT struct {
	testing.TB
	dir  string
	logf func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

// fatalError is what programT's Fatal methods panic with.
type fatalError struct{ msg string }

func (f fatalError) Error() string { return f.msg }

func (t *programT) Helper() {}

func (t *programT) Logf(format string, args ...any) { t.logf(format, args...) }

func (t *programT) Log(args ...any) { t.logf("%s", fmt.Sprint(args...)) }

func (t *programT) Errorf(format string, args ...any) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	t.logf("error: "+format, args...)
}

func (t *programT) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }

func (t *programT) Fatalf(format string, args ...any) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	panic(fatalError{fmt.Sprintf(format, args...)})
}

func (t *programT) Fatal(args ...any) { t.Fatalf("%s", fmt.Sprint(args...)) }

// Skip is fatal: a comparison runs only with everything it needs.
func (t *programT) Skip(args ...any) { t.Fatalf("cannot run: %s", fmt.Sprint(args...)) }

func (t *programT) Skipf(format string, args ...any) { t.Fatalf("cannot run: "+format, args...) }

func (t *programT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *programT) Name() string { return "compare" }

// TempDir returns a new folder under t's own.
func (t *programT) TempDir() string {
	t.mu.Lock()
	t.temps++
	dir := filepath.Join(t.dir, fmt.Sprintf("tmp%d", t.temps))
	t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	return dir
}

func (t *programT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// close runs the cleanups, newest first; one that fails is logged and the
// rest still run.
func (t *programT) close() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.logf("cleanup failed: %v", r)
				}
			}()
			f()
		}()
	}
}
