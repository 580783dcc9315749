// Package programt lets a program, rather than a test, use helpers written
// for tests that take a testing.TB (test/e2e/controlplane): the soak and
// the side-by-side comparison start the test control plane with it.
package programt

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// T is the part of testing.TB those helpers use. Fatal panics with a
// Fatal value, which Catch turns into an error where the program called
// the helper; Cleanup functions run, newest first, at Close. The embedded
// nil testing.TB panics on any other method.
type T struct {
	testing.TB
	name string
	logf func(format string, args ...any)
	dir  string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

// Fatal is what T's Fatal methods panic with.
type Fatal struct{ msg string }

func (f Fatal) Error() string { return f.msg }

// New returns a T named name whose temporary folders go under dir and
// whose log lines go to logf.
func New(name, dir string, logf func(format string, args ...any)) *T {
	return &T{name: name, dir: dir, logf: logf}
}

// Catch runs f and turns a Fatal panic from a test helper into an error.
func Catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fe, ok := r.(Fatal); ok {
				err = fe
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

func (t *T) Helper() {}

func (t *T) Logf(format string, args ...any) { t.logf(format, args...) }

func (t *T) Log(args ...any) { t.logf("%s", fmt.Sprint(args...)) }

func (t *T) Errorf(format string, args ...any) {
	t.setFailed()
	t.logf("error: "+format, args...)
}

func (t *T) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }

func (t *T) Fatalf(format string, args ...any) {
	t.setFailed()
	panic(Fatal{fmt.Sprintf(format, args...)})
}

func (t *T) Fatal(args ...any) { t.Fatalf("%s", fmt.Sprint(args...)) }

// Skip is fatal: a program runs only when everything it needs is there.
func (t *T) Skip(args ...any) { t.Fatalf("cannot run: %s", fmt.Sprint(args...)) }

func (t *T) Skipf(format string, args ...any) { t.Fatalf("cannot run: "+format, args...) }

func (t *T) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *T) setFailed() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *T) Name() string { return t.name }

// TempDir returns a new folder under t's own.
func (t *T) TempDir() string {
	t.mu.Lock()
	t.temps++
	dir := filepath.Join(t.dir, fmt.Sprintf("tmp%d", t.temps))
	t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	return dir
}

func (t *T) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// Close runs the cleanups, newest first; one that fails is logged and the
// rest still run.
func (t *T) Close() {
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
