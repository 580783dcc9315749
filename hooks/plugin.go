package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"golang.org/x/sys/cpu"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// maxIdle is how many idle instances a plugin keeps. With maxWorkers it
// bounds a plugin's instances, and so its memory (docs/plugin-abi.md): an
// instance is made only when none is idle, by one of at most maxWorkers
// calls, so at most max(maxIdle, maxWorkers) exist at a time. The second
// worker, and with it a second instance, runs only while a long batch
// lasts (see secondWorkerAfter); the pool then closes the extra instance.
const maxIdle = 1

// plugin is one loaded version of a plugin file: its compiled module (in
// a runtime of its memory limit, shared with the plugins loaded from the
// same bytes under the same limit) and a pool of idle instances.
type plugin struct {
	*settings
	sha     string
	log     *slog.Logger
	mod     *module
	modules *modules // where mod goes back on close

	mu       sync.Mutex
	idle     []*instance
	starting chan struct{} // while renew makes a fresh instance; closed when it is idle
	closed   bool

	bg     sync.WaitGroup     // renew's instantiations
	bgCtx  context.Context    // theirs, canceled by close
	bgStop context.CancelFunc //

	calls    atomic.Int64 // weir_process calls, for tests
	sent     atomic.Int64 // services sent, for tests
	memories reserved     // instances' memory reservations, for tests
}

// open reads, verifies and loads a plugin file.
func open(ctx context.Context, s *settings, ms *modules, cache wazero.CompilationCache, log *slog.Logger) (*plugin, error) {
	data, sum, err := fetch(ctx, s)
	if err != nil {
		return nil, err
	}
	return load(ctx, s, data, sum, ms, cache, log)
}

// readFile reads a plugin file and returns it with its hex sha256.
func readFile(s *settings) ([]byte, string, error) {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, "", fmt.Errorf("plugin %q: %w", s.Name, err)
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

// load checks data against the pinned sha256, compiles it and checks that
// it instantiates and accepts its configuration.
func load(ctx context.Context, s *settings, data []byte, sum string, ms *modules, cache wazero.CompilationCache,
	log *slog.Logger) (*plugin, error) {
	if s.SHA256 != "" && sum != s.SHA256 {
		return nil, fmt.Errorf("plugin %q: sha256 of %s is %s, config pins %s", s.Name, s.Path, sum, s.SHA256)
	}
	data, err := boundTables(data, s.MemoryLimit)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: %s: %w", s.Name, s.Path, err)
	}
	p := &plugin{settings: s, sha: sum, log: log, modules: ms}
	p.bgCtx, p.bgStop = context.WithCancel(context.Background())
	if !compilerSupported() {
		log.Warn("This CPU cannot run wazero's compiled code (amd64 without SSE4.1); the plugin runs in wazero's interpreter, several times slower",
			"plugin", s.Name)
	}
	if err := p.compile(ctx, data, cache); err != nil {
		_ = p.close()
		return nil, fmt.Errorf("plugin %q: %s: %w", s.Name, s.Path, err)
	}
	return p, nil
}

// compilerSupported reports whether wazero compiles plugins to machine code
// here, as it does on arm64 and on amd64 with SSE4.1.
func compilerSupported() bool {
	return runtime.GOARCH != "amd64" || cpu.X86.HasSSE41
}

// compile takes the plugin's module, compiling data unless a loaded
// plugin shares it, and makes the first instance.
func (p *plugin) compile(ctx context.Context, data []byte, cache wazero.CompilationCache) error {
	mod, err := p.modules.acquire(ctx, moduleKey{sha: p.sha, pages: p.pages}, data, cache)
	if err != nil {
		return err
	}
	p.mod = mod
	inst, err := p.newInstance(ctx)
	if err != nil {
		return err
	}
	if len(p.Signals) > 0 && inst.version < abi.Version2 {
		inst.close()
		return fmt.Errorf("it speaks plugin ABI version %d, which carries no signals: rebuild it with an SDK speaking version 2, or configure it without signals", inst.version)
	}
	p.put(inst)
	return nil
}

// initTimeout bounds bringing up an instance.
func (p *plugin) initTimeout() time.Duration {
	return max(p.Timeout, time.Second)
}

// run sends one batch holding the services in to the instance at *inst,
// taking one from the pool when it is nil, and returns the services Weir
// will use. With next not nil it also returns the batch that relays them
// to the next plugin, written over next (which may be batch itself; see
// relay). On any error the instance is discarded and *inst set to nil.
func (p *plugin) run(ctx context.Context, inst **instance, batch []byte, in []*plan.Service,
	next []byte) (out []*plan.Service, relayed []byte, err error) {
	if *inst == nil {
		if *inst, err = p.get(ctx); err != nil {
			return nil, nil, err
		}
	}
	p.calls.Add(1)
	p.sent.Add(int64(len(in)))
	err = (*inst).call(ctx, batch, 2*len(batch)+4096, func(output []byte) (err error) {
		defer func() {
			if r := recover(); r != nil { // Decode and relay must not panic; if they do, the plugin failed
				err = fmt.Errorf("host panic while reading the output: %v", r)
			}
		}()
		if out, err = abi.DecodeVersion(le.Uint16(batch[4:]), in, output); err != nil {
			return fmt.Errorf("invalid output: %w", err)
		}
		if next != nil {
			relayed = relay(next, batch, output, in, out)
		}
		return nil
	})
	if err != nil {
		(*inst).close()
		*inst = nil
		return nil, nil, err
	}
	return out, relayed, nil
}

// get takes an idle instance, waits for the one renew is making, or makes
// a new one.
func (p *plugin) get(ctx context.Context) (*instance, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errClosed
		}
		if n := len(p.idle); n > 0 {
			inst := p.idle[n-1]
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			return inst, nil
		}
		starting := p.starting
		p.mu.Unlock()
		if starting == nil {
			break
		}
		select {
		case <-starting:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	inst, err := p.newInstance(ctx)
	if err != nil {
		return nil, fmt.Errorf("new instance: %w", err)
	}
	return inst, nil
}

// put returns a healthy instance to the pool, or closes it when the pool is full.
func (p *plugin) put(inst *instance) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdle {
		p.idle = append(p.idle, inst)
		inst = nil
	}
	p.mu.Unlock()
	if inst != nil {
		inst.close()
	}
}

// renew gives back the memory a big batch made the plugin's idle instance
// grow: when it holds more than regrowSlack beyond what it had after
// starting, it is closed and a fresh one made in the background. A
// WebAssembly memory never shrinks, whatever the plugin frees; a fresh
// instance costs some 15 ms, which the next call waits for only when it
// comes sooner.
func (p *plugin) renew() {
	p.mu.Lock()
	if p.closed || p.starting != nil || len(p.idle) == 0 || !p.idle[0].grown() {
		p.mu.Unlock()
		return
	}
	old := p.idle
	p.idle = nil
	starting := make(chan struct{})
	p.starting = starting
	p.bg.Add(1)
	p.mu.Unlock()
	for _, inst := range old {
		inst.close()
	}
	go func() {
		defer p.bg.Done()
		defer close(starting)
		inst, err := p.newInstance(p.bgCtx)
		p.mu.Lock()
		p.starting = nil
		if err == nil && !p.closed && len(p.idle) < maxIdle {
			p.idle, inst = append(p.idle, inst), nil
		}
		p.mu.Unlock()
		if inst != nil {
			inst.close()
		}
		if err != nil && p.bgCtx.Err() == nil {
			p.log.Warn("Could not start a fresh plugin instance; the next call makes one", "plugin", p.Name, "error", err)
		}
	}()
}

// settled waits until no fresh instance is being made, for tests.
func (p *plugin) settled() {
	p.bg.Wait()
}

// close releases the plugin's instances, module and runtime; it is idempotent.
func (p *plugin) close() error {
	p.mu.Lock()
	idle, already := p.idle, p.closed
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	if already {
		return nil
	}
	p.bgStop()
	p.bg.Wait()
	for _, inst := range idle {
		inst.close()
	}
	var err error
	if p.mod != nil {
		err = p.modules.release(p.mod)
	}
	if err != nil {
		return fmt.Errorf("plugin %q: close: %w", p.Name, err)
	}
	return nil
}
