package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/weirproxy/weir/sdk/abi"
)

// The exports of docs/plugin-abi.md.
const (
	exportInitialize = "_initialize"
	exportVersion    = "weir_abi_version"
	exportAlloc      = "weir_alloc"
	exportFree       = "weir_free"
	exportConfigure  = "weir_configure"
	exportProcess    = "weir_process"
)

// export is one export Weir calls, checked after the ABI version.
type export struct {
	name            string
	params, results []api.ValueType
	required        bool
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

var exports = []export{
	{exportInitialize, nil, nil, false},
	{exportAlloc, []api.ValueType{i32}, []api.ValueType{i32}, true},
	{exportFree, []api.ValueType{i32}, nil, true},
	{exportConfigure, []api.ValueType{i32, i32}, []api.ValueType{i32}, false},
	{exportProcess, []api.ValueType{i32, i32}, []api.ValueType{i64}, true},
}

// instance is one instantiation of a plugin's module. It is not safe for
// concurrent calls; after any error it must be closed, never reused.
type instance struct {
	mod     api.Module
	memory  *linearMemory // backs mem
	mem     api.Memory
	alloc   api.Function
	free    api.Function
	process api.Function
	out     *output
	timeout time.Duration
	stack   [2]uint64
	started uint32 // memory size in bytes once started
	version uint16 // the ABI version the plugin speaks (weir_abi_version)

	// The buffer from weir_alloc the instance keeps for its batches, and
	// its size: a plugin gets the same buffer for every batch that fits,
	// instead of a fresh allocation each time, which a Go guest backs with
	// fresh pages of its memory until its garbage collector runs.
	batch    uint32
	batchCap int
}

// batchRound rounds the size of a batch buffer up, so that the next
// batches, a little larger, fit as well.
const batchRound = 64 << 10

// regrowSlack is how much an instance's memory may grow beyond its size
// once started before renew replaces it. A Go guest starts with 3–4 MiB
// and, sent every batch in the same buffer, grows by well under 1 MiB
// through a full sync of 10k services (to 6–8 MiB when each batch came
// in a fresh buffer).
const regrowSlack = 1 << 20

// grown reports whether the instance's memory grew by more than regrowSlack
// since it started.
func (inst *instance) grown() bool {
	return uint64(inst.mem.Size()) > uint64(inst.started)+regrowSlack
}

// newInstance instantiates the plugin's module, runs _initialize, checks the
// ABI version and the exports, and configures it. Instantiation is bounded
// by initTimeout, not the per-call timeout: a Go guest's runtime start-up
// alone takes several milliseconds.
func (p *plugin) newInstance(ctx context.Context) (_ *instance, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.initTimeout())
	defer cancel()
	out := newOutput(p.log, p.Name)
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions().
		WithStdout(&out.stdout).WithStderr(&out.stderr)
	memory, err := reserveMemory(p.MemoryLimit, &p.memories)
	if err != nil {
		return nil, err
	}
	mod, err := p.mod.rt.InstantiateModule(memory.allocator(ctx), p.mod.code, cfg)
	if err != nil {
		memory.Free()
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	inst := &instance{mod: mod, memory: memory, out: out, timeout: p.initTimeout()} // for start's error messages
	defer func() {
		if err != nil {
			inst.close()
		}
	}()
	err = inst.start(ctx, p.config)
	inst.timeout = p.Timeout
	out.end()
	if err != nil {
		return nil, withStderr(err, out)
	}
	inst.started = inst.mem.Size()
	return inst, nil
}

// start brings a fresh instance up to its first call.
func (inst *instance) start(ctx context.Context, config []byte) error {
	if f := inst.mod.ExportedFunction(exportInitialize); f != nil {
		if err := f.CallWithStack(ctx, inst.stack[:]); err != nil {
			return callError(exportInitialize, inst.timeout, err)
		}
	}
	version := inst.mod.ExportedFunction(exportVersion)
	if version == nil || !sameTypes(version.Definition(), nil, []api.ValueType{i32}) {
		return fmt.Errorf("export %s () -> i32 is missing: not a Weir plugin", exportVersion)
	}
	if err := version.CallWithStack(ctx, inst.stack[:]); err != nil {
		return callError(exportVersion, inst.timeout, err)
	}
	v := uint32(inst.stack[0])
	if v < uint32(abi.Version1) || v > uint32(abi.Version) {
		return fmt.Errorf("it speaks plugin ABI version %d, this Weir speaks versions %d to %d", v, abi.Version1, abi.Version)
	}
	inst.version = uint16(v)
	for _, e := range exports {
		f := inst.mod.ExportedFunction(e.name)
		if f == nil {
			if e.required {
				return fmt.Errorf("export %s is missing", e.name)
			}
			continue
		}
		if !sameTypes(f.Definition(), e.params, e.results) {
			return fmt.Errorf("export %s has type %s, want %s", e.name,
				signature(f.Definition().ParamTypes(), f.Definition().ResultTypes()), signature(e.params, e.results))
		}
	}
	inst.mem = inst.mod.Memory()
	if inst.mem == nil {
		return errors.New("the module has no memory")
	}
	inst.alloc = inst.mod.ExportedFunction(exportAlloc)
	inst.free = inst.mod.ExportedFunction(exportFree)
	inst.process = inst.mod.ExportedFunction(exportProcess)
	return inst.configure(ctx, config)
}

// configure hands the plugin its configuration JSON.
func (inst *instance) configure(ctx context.Context, config []byte) error {
	f := inst.mod.ExportedFunction(exportConfigure)
	if f == nil {
		if string(config) != "null" {
			return fmt.Errorf("it has a config but no %s export", exportConfigure)
		}
		return nil
	}
	ptr, err := inst.write(ctx, config)
	if err != nil {
		return err
	}
	inst.stack[0], inst.stack[1] = uint64(ptr), uint64(len(config))
	if err := f.CallWithStack(ctx, inst.stack[:]); err != nil {
		return callError(exportConfigure, inst.timeout, err)
	}
	if st := abi.Status(uint32(inst.stack[0])); st != abi.StatusOK {
		return fmt.Errorf("%s returned status %s", exportConfigure, st)
	}
	return inst.release(ctx, ptr)
}

// call runs weir_process on one encoded batch and hands its output, at
// most maxOut bytes and still in the plugin's memory, to read, which must
// not keep it: the buffers are freed after read returns. It does not
// validate the output; an error from read fails the call.
func (inst *instance) call(ctx context.Context, batch []byte, maxOut int, read func(output []byte) error) (err error) {
	inst.out.begin()
	defer func() {
		if r := recover(); r != nil { // wazero should not panic; if it does, the instance is retired
			err = fmt.Errorf("host panic while calling the plugin: %v", r)
		}
		inst.out.end()
		err = withStderr(err, inst.out)
	}()
	in, out, output, err := inst.send(ctx, batch, maxOut)
	if err != nil {
		return err
	}
	if err := read(output); err != nil {
		return err
	}
	if out == in {
		return nil
	}
	// The free gets a deadline of its own: reading a big output takes the
	// host a while, which is not the plugin's time.
	ctx, cancel := context.WithTimeout(ctx, inst.timeout)
	defer cancel()
	return inst.release(ctx, out)
}

// send writes the batch into the plugin's memory and runs weir_process on
// it; it returns the addresses of the batch and of the output, and the
// output, in the plugin's memory.
func (inst *instance) send(ctx context.Context, batch []byte, maxOut int) (in, out uint32, output []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, inst.timeout)
	defer cancel()
	in, err = inst.place(ctx, batch)
	if err != nil {
		return 0, 0, nil, err
	}
	inst.stack[0], inst.stack[1] = uint64(in), uint64(len(batch))
	if err := inst.process.CallWithStack(ctx, inst.stack[:]); err != nil {
		return 0, 0, nil, callError(exportProcess, inst.timeout, err)
	}
	out, n := uint32(inst.stack[0]>>32), uint32(inst.stack[0])
	switch {
	case out == 0 && n == 0:
		return 0, 0, nil, fmt.Errorf("%s returned neither an output nor a failure status", exportProcess)
	case out == 0:
		return 0, 0, nil, fmt.Errorf("%s returned status %s", exportProcess, abi.Status(n))
	case int64(n) > int64(maxOut):
		return 0, 0, nil, fmt.Errorf("%s returned %d bytes, more than the limit of %d (twice the input plus 4 KiB)",
			exportProcess, n, maxOut)
	}
	output, ok := inst.mem.Read(out, n)
	if !ok {
		return 0, 0, nil, fmt.Errorf("%s returned %d bytes at %#x, outside its memory of %d bytes",
			exportProcess, n, out, inst.mem.Size())
	}
	return in, out, output, nil
}

// place copies a batch into the instance's batch buffer and returns its
// address. A batch larger than the buffer gets a new one, rounded up to
// batchRound, and the old one is freed.
func (inst *instance) place(ctx context.Context, batch []byte) (uint32, error) {
	if len(batch) > inst.batchCap {
		if inst.batch != 0 {
			if err := inst.release(ctx, inst.batch); err != nil {
				return 0, err
			}
			inst.batch, inst.batchCap = 0, 0
		}
		size := (len(batch) + batchRound - 1) / batchRound * batchRound
		ptr, err := inst.allocate(ctx, size)
		if err != nil {
			return 0, err
		}
		inst.batch, inst.batchCap = ptr, size
	}
	if !inst.mem.Write(inst.batch, batch) {
		return 0, fmt.Errorf("%s(%d) returned %#x, outside its memory of %d bytes",
			exportAlloc, inst.batchCap, inst.batch, inst.mem.Size())
	}
	return inst.batch, nil
}

// write copies data into a buffer from weir_alloc and returns its address.
func (inst *instance) write(ctx context.Context, data []byte) (uint32, error) {
	ptr, err := inst.allocate(ctx, len(data))
	if err != nil {
		return 0, err
	}
	if !inst.mem.Write(ptr, data) {
		return 0, fmt.Errorf("%s(%d) returned %#x, outside its memory of %d bytes",
			exportAlloc, len(data), ptr, inst.mem.Size())
	}
	return ptr, nil
}

// allocate calls weir_alloc.
func (inst *instance) allocate(ctx context.Context, size int) (uint32, error) {
	inst.stack[0] = uint64(size)
	if err := inst.alloc.CallWithStack(ctx, inst.stack[:]); err != nil {
		return 0, callError(exportAlloc, inst.timeout, err)
	}
	ptr := uint32(inst.stack[0])
	if ptr == 0 {
		return 0, fmt.Errorf("%s(%d) failed", exportAlloc, size)
	}
	return ptr, nil
}

// release hands a buffer back with weir_free.
func (inst *instance) release(ctx context.Context, ptr uint32) error {
	inst.stack[0] = uint64(ptr)
	if err := inst.free.CallWithStack(ctx, inst.stack[:]); err != nil {
		return callError(exportFree, inst.timeout, err)
	}
	return nil
}

// close releases the instance; it is idempotent.
func (inst *instance) close() {
	inst.out.end()
	_ = inst.mod.Close(context.Background())
	inst.memory.Free()
}

// callError says how a call into the plugin ended when it did not return.
func callError(export string, timeout time.Duration, err error) error {
	var exit *sys.ExitError
	if !errors.As(err, &exit) {
		// A trap's message goes on with a wasm stack trace: keep its first line.
		msg, _, _ := strings.Cut(err.Error(), "\n")
		return fmt.Errorf("%s: %s", export, msg)
	}
	switch exit.ExitCode() {
	case sys.ExitCodeDeadlineExceeded:
		return fmt.Errorf("%s: timed out after %s", export, timeout)
	case sys.ExitCodeContextCanceled:
		return fmt.Errorf("%s: canceled", export)
	default:
		return fmt.Errorf("%s: the plugin exited with code %d", export, exit.ExitCode())
	}
}

// withStderr adds the call's first stderr line, the plugin's own account
// of a failure, to err.
func withStderr(err error, out *output) error {
	if err == nil || out.firstErr == "" {
		return err
	}
	return fmt.Errorf("%w (stderr: %s)", err, out.firstErr)
}

// signature formats a function type as the ABI document does: (i32, i32) -> i64.
func signature(params, results []api.ValueType) string {
	names := func(types []api.ValueType) string {
		s := make([]string, len(types))
		for i, t := range types {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return names(params) + " -> " + names(results)
}

func sameTypes(d api.FunctionDefinition, params, results []api.ValueType) bool {
	return bytes.Equal(d.ParamTypes(), params) && bytes.Equal(d.ResultTypes(), results)
}
