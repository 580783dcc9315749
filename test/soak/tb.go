package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// harnessT lets the soak, a program rather than a test, use the helpers
// written for tests (test/e2e/controlplane takes a testing.TB). Fatal
// panics with a fatal value, which the soak recovers where it called the
// helper; Cleanup functions run, newest first, at close. Only the methods
// those helpers call are implemented: the embedded nil testing.TB panics
// on any other, which the soak never calls.
type harnessT struct {
	testing.TB
	logf func(format string, args ...any)
	dir  string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

// fatal is what harnessT's Fatal methods panic with.
type fatal struct{ msg string }

func (f fatal) Error() string { return f.msg }

func newHarnessT(dir string, logf func(format string, args ...any)) *harnessT {
	return &harnessT{dir: dir, logf: logf}
}

func (t *harnessT) Helper() {}

func (t *harnessT) Logf(format string, args ...any) { t.logf(format, args...) }

func (t *harnessT) Log(args ...any) { t.logf("%s", fmt.Sprint(args...)) }

func (t *harnessT) Errorf(format string, args ...any) {
	t.setFailed()
	t.logf("error: "+format, args...)
}

func (t *harnessT) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }

func (t *harnessT) Fatalf(format string, args ...any) {
	t.setFailed()
	panic(fatal{fmt.Sprintf(format, args...)})
}

func (t *harnessT) Fatal(args ...any) { t.Fatalf("%s", fmt.Sprint(args...)) }

// Skip is fatal: the soak runs only when everything it needs is there.
func (t *harnessT) Skip(args ...any) { t.Fatalf("cannot run: %s", fmt.Sprint(args...)) }

func (t *harnessT) Skipf(format string, args ...any) { t.Fatalf("cannot run: "+format, args...) }

func (t *harnessT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *harnessT) setFailed() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *harnessT) Name() string { return "soak" }

// TempDir returns a new folder under the soak's own.
func (t *harnessT) TempDir() string {
	t.mu.Lock()
	t.temps++
	dir := filepath.Join(t.dir, fmt.Sprintf("tmp%d", t.temps))
	t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	return dir
}

func (t *harnessT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// close runs the cleanups, newest first; a fatal one is logged and the
// rest still run.
func (t *harnessT) close() {
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

// catch runs f and turns a fatal panic from a test helper into an error.
func catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fe, ok := r.(fatal); ok {
				err = fe
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}
