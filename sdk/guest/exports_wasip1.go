//go:build wasip1

package guest

import (
	"errors"
	"os"
	"runtime"
	"unsafe"

	"github.com/weirproxy/weir/sdk/abi"
)

var errNotRegistered = errors.New("no plugin registered: call guest.Register from init")

// buffers keeps the buffers handed to the host alive until weir_free, keyed by their address.
var buffers = map[uint32][]byte{}

// lookup returns the first n bytes of the buffer allocated at ptr, or false.
func lookup(ptr, n uint32) ([]byte, bool) {
	b, ok := buffers[ptr]
	if !ok || uint64(n) > uint64(len(b)) {
		return nil, false
	}
	return b[:n], true
}

//go:wasmexport weir_abi_version
func weirABIVersion() int32 { return int32(abi.Version) }

//go:wasmexport weir_alloc
func weirAlloc(size int32) (ptr uint32) {
	defer yield()
	defer func() {
		if r := recover(); r != nil {
			writeLine(os.Stderr, "weir_alloc: panic: "+panicText(r)+panicSite())
			ptr = 0
		}
	}()
	if size < 0 {
		return 0
	}
	b := make([]byte, max(size, 1))
	ptr = uint32(uintptr(unsafe.Pointer(&b[0])))
	buffers[ptr] = b
	return ptr
}

//go:wasmexport weir_free
func weirFree(ptr uint32) {
	delete(buffers, ptr)
}

//go:wasmexport weir_configure
func weirConfigure(ptr, n uint32) (status uint32) {
	defer yield()
	defer func() {
		if r := recover(); r != nil {
			writeLine(os.Stderr, "weir_configure: panic: "+panicText(r)+panicSite())
			status = uint32(abi.StatusPanic)
		}
	}()
	config, ok := lookup(ptr, n)
	if !ok && n != 0 {
		writeLine(os.Stderr, "weir_configure: the config is not in a buffer from weir_alloc")
		return uint32(abi.StatusBadInput)
	}
	return uint32(Configure(plugin(), config, os.Stderr))
}

//go:wasmexport weir_process
func weirProcess(ptr, n uint32) (result uint64) {
	defer yield()
	defer func() {
		if r := recover(); r != nil {
			writeLine(os.Stderr, "weir_process: panic: "+panicText(r)+panicSite())
			result = uint64(abi.StatusPanic)
		}
	}()
	in, ok := lookup(ptr, n)
	if !ok {
		writeLine(os.Stderr, "weir_process: the batch is not in a buffer from weir_alloc")
		return uint64(abi.StatusBadInput)
	}
	out, status := Process(plugin(), in, os.Stderr)
	if status != abi.StatusOK {
		return uint64(status)
	}
	// Process edits the batch in place: the output is the input buffer.
	return uint64(ptr)<<32 | uint64(len(out))
}

// yield lets the runtime's own goroutines run before an export returns to
// the host. Without it a garbage collection that an export started can stay
// unfinished (its background workers never get scheduled), and the heap then
// grows on every call until the instance runs out of memory.
func yield() { runtime.Gosched() }

// plugin returns the registered plugin; without one, every batch fails.
func plugin() Plugin {
	if registered == nil {
		return Plugin{Process: func(*abi.Batch) error { return errNotRegistered }}
	}
	return *registered
}
