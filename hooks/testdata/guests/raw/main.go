// Command raw is a test plugin that implements the ABI's exports itself,
// without the SDK, to break the contract in ways the SDK never would. Its
// config ({"mode": "..."}) picks the misbehaviour, which it shows only on
// batches holding a service annotated hostile.weir.dev/act: "true"; build
// it with -ldflags "-X main.abiVersion=3" to declare another ABI version.
package main

import (
	"encoding/json"
	"strconv"
	"unsafe"

	"github.com/weirproxy/weir/sdk/abi"
)

// abiVersion is the version weir_abi_version reports.
var abiVersion = "1"

var (
	mode    string
	buffers = map[uint32][]byte{}
)

func main() {}

func address(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

//go:wasmexport weir_abi_version
func weirABIVersion() int32 {
	v, _ := strconv.Atoi(abiVersion)
	return int32(v)
}

//go:wasmexport weir_alloc
func weirAlloc(size int32) uint32 {
	b := make([]byte, max(size, 1))
	buffers[address(b)] = b
	return address(b)
}

//go:wasmexport weir_free
func weirFree(ptr uint32) { delete(buffers, ptr) }

//go:wasmexport weir_configure
func weirConfigure(ptr, n uint32) uint32 {
	var c struct {
		Mode string `json:"mode"`
	}
	if err := json.Unmarshal(buffers[ptr][:n], &c); err != nil {
		return 4
	}
	mode = c.Mode
	return 0
}

//go:wasmexport weir_process
func weirProcess(ptr, n uint32) uint64 {
	if !acts(buffers[ptr][:n]) {
		return uint64(ptr)<<32 | uint64(n)
	}
	switch mode {
	case "oversize": // an output longer than twice the input plus 4 KiB
		out := make([]byte, 2*n+8192)
		copy(out, buffers[ptr])
		buffers[address(out)] = out
		return uint64(address(out))<<32 | uint64(len(out))
	case "badptr": // an output outside the module's memory
		return uint64(0xfff00000)<<32 | uint64(n)
	case "nooutput": // neither an output nor a failure status
		return 0
	case "trap": // an unrecovered panic: the Go runtime exits
		var p *[4]byte
		return uint64(p[n%4])
	}
	return uint64(ptr)<<32 | uint64(n)
}

// acts reports whether the batch holds a service that triggers the mode.
func acts(buf []byte) bool {
	b, err := abi.Parse(buf)
	if err != nil {
		return true
	}
	for i := range b.Len() {
		if v, _ := b.Service(i).Annotation("hostile.weir.dev/act"); v == "true" {
			return true
		}
	}
	return false
}
