package hooks

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// moduleKey identifies compiled code that plugins can share: the same
// file's bytes (by sha256) under the same memory limit, which sets both
// the runtime's page limit and how boundTables rewrites the file.
type moduleKey struct {
	sha   string
	pages uint32
}

// module is one runtime with one compiled module in it, shared by every
// loaded plugin of the same moduleKey: each has its own instances and
// configuration, but the file is decoded, validated and compiled once.
// wazero validates a module even when its compiled code comes from the
// cache, some 35 ms for a Go plugin, and loading is on the way to a
// restart's first sync.
type module struct {
	key   moduleKey
	ready chan struct{} // closed once rt, code and err are set
	rt    wazero.Runtime
	code  wazero.CompiledModule
	err   error
	refs  int // guarded by modules.mu
}

// modules is a chain's registry of shared modules.
type modules struct {
	mu    sync.Mutex
	byKey map[moduleKey]*module
}

// acquire returns the module of key, compiling data into a new runtime
// when no loaded plugin has it yet; a concurrent acquire of the same key
// waits for that compilation. Every module acquire returns must be
// released.
func (ms *modules) acquire(ctx context.Context, key moduleKey, data []byte, cache wazero.CompilationCache) (*module, error) {
	ms.mu.Lock()
	if m := ms.byKey[key]; m != nil {
		m.refs++
		ms.mu.Unlock()
		<-m.ready
		if m.err != nil {
			return nil, errors.Join(m.err, ms.release(m))
		}
		return m, nil
	}
	if ms.byKey == nil {
		ms.byKey = map[moduleKey]*module{}
	}
	m := &module{key: key, ready: make(chan struct{}), refs: 1}
	ms.byKey[key] = m
	ms.mu.Unlock()
	m.rt, m.code, m.err = compileModule(ctx, key.pages, data, cache)
	close(m.ready)
	if m.err != nil {
		return nil, errors.Join(m.err, ms.release(m))
	}
	return m, nil
}

// release drops one reference to m, closing its module and runtime with
// the last one.
func (ms *modules) release(m *module) error {
	ms.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last && ms.byKey[m.key] == m {
		delete(ms.byKey, m.key)
	}
	ms.mu.Unlock()
	if !last {
		return nil
	}
	var errs []error
	ctx := context.Background()
	if m.code != nil {
		errs = append(errs, m.code.Close(ctx))
	}
	if m.rt != nil {
		errs = append(errs, m.rt.Close(ctx))
	}
	return errors.Join(errs...)
}

// compileModule sets up a runtime limited to pages of memory, with WASI,
// and compiles data in it. wazero compiles to machine code where it can
// (on amd64 it needs SSE4.1), and interprets elsewhere: slower, but a
// plugin still runs instead of the process dying of SIGILL.
func compileModule(ctx context.Context, pages uint32, data []byte, cache wazero.CompilationCache) (wazero.Runtime, wazero.CompiledModule, error) {
	cfg := wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithMemoryLimitPages(pages).
		WithCloseOnContextDone(true)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("WASI: %w", err), rt.Close(ctx))
	}
	code, err := rt.CompileModule(ctx, data)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("compile: %w", err), rt.Close(ctx))
	}
	return rt, code, nil
}
