// Package guest is the Go runtime of a Weir hook plugin: a plugin registers
// its callbacks from init, and the WebAssembly exports (built for wasip1)
// call them.
//
// A plugin is package main:
//
//	func init() { guest.Register(guest.Plugin{Process: process}) }
//	func main() {}
//
// built with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
)

// Plugin is what a Go plugin registers: its two callbacks.
type Plugin struct {
	// Configure receives the plugin's config as JSON ("null" when none); nil accepts only none.
	Configure func(config []byte) error
	// Process edits the batch in place; an error fails the batch (StatusFailed).
	Process func(b *abi.Batch) error
}

var registered *Plugin

// Register sets the plugin the WebAssembly exports call; call it once from init().
func Register(p Plugin) {
	if registered != nil {
		panic("guest: Register called twice")
	}
	registered = &p
}

// DecodeConfig decodes a JSON configuration into v strictly: unknown fields
// and trailing data are errors; "null" or an empty config leaves v alone.
func DecodeConfig(config []byte, v any) error {
	if noConfig(config) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New("config: " + err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("config: unexpected data after the JSON value")
	}
	return nil
}

// noConfig reports whether config is empty or JSON null.
func noConfig(config []byte) bool {
	c := bytes.TrimSpace(config)
	return len(c) == 0 || string(c) == "null"
}

// Process runs p on one input exactly as the weir_process export does: Parse, p.Process inside recover(),
// reasons written to the given stderr writer. Exported so sdktest and the exports share one path.
// The output is the input, edited in place, when the status is StatusOK.
func Process(p Plugin, in []byte, stderr io.Writer) (out []byte, status abi.Status) {
	defer func() {
		if r := recover(); r != nil {
			writeLine(stderr, "panic: "+panicText(r)+panicSite())
			out, status = nil, abi.StatusPanic
		}
	}()
	b, err := abi.Parse(in)
	if err != nil {
		writeLine(stderr, "bad batch: "+err.Error())
		return nil, abi.StatusBadInput
	}
	if p.Process != nil {
		if err := p.Process(b); err != nil {
			writeLine(stderr, err.Error())
			return nil, abi.StatusFailed
		}
	}
	return b.Bytes(), abi.StatusOK
}

// Configure hands config to p.Configure as the weir_configure export does,
// inside recover(), writing the reason for a failure to stderr. A plugin
// without a Configure callback accepts only an empty or null config.
func Configure(p Plugin, config []byte, stderr io.Writer) (status abi.Status) {
	defer func() {
		if r := recover(); r != nil {
			writeLine(stderr, "panic: "+panicText(r)+panicSite())
			status = abi.StatusPanic
		}
	}()
	if p.Configure == nil {
		if noConfig(config) {
			return abi.StatusOK
		}
		writeLine(stderr, "config: this plugin takes no configuration")
		return abi.StatusBadConfig
	}
	if len(bytes.TrimSpace(config)) == 0 {
		config = []byte("null")
	}
	if err := p.Configure(config); err != nil {
		writeLine(stderr, err.Error())
		return abi.StatusBadConfig
	}
	return abi.StatusOK
}

// writeLine writes s and a newline to w, ignoring errors (stderr is best effort).
func writeLine(w io.Writer, s string) {
	if w != nil {
		_, _ = io.WriteString(w, s+"\n")
	}
}

// panicText describes a recovered panic value without fmt.
func panicText(r any) string {
	switch v := r.(type) {
	case error:
		return v.Error()
	case string:
		return v
	case interface{ String() string }:
		return v.String()
	case int:
		return strconv.Itoa(v)
	}
	return "(a value that is not an error or string)"
}

// panicSite says where the panic being recovered was raised, as
// " (at FILE:LINE in FUNC)": the innermost frame outside the runtime, below
// the panic, so not the deferred function that recovers. When that frame
// is in the SDK (an abi accessor given a bad index, say), it adds the
// frame that called into that package, usually the plugin's. It must be
// called by the deferred function that calls recover; "" when the stack
// holds no panic.
func panicSite() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	panicking := false
	var site runtime.Frame
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case !panicking || strings.HasPrefix(f.Function, "runtime."):
		case site.Function == "":
			site = f
			if !inSDK(site) {
				return " (at " + frameText(site) + ")"
			}
		case funcPackage(f.Function) != funcPackage(site.Function):
			return " (at " + frameText(site) + ", called from " + frameText(f) + ")"
		}
		if !more {
			break
		}
	}
	if site.Function != "" {
		return " (at " + frameText(site) + ")"
	}
	return ""
}

// sdkPath prefixes the functions of the SDK's packages.
const sdkPath = "github.com/weirproxy/weir/sdk/"

// inSDK reports whether f is the SDK's own code (not its tests).
func inSDK(f runtime.Frame) bool {
	return strings.HasPrefix(f.Function, sdkPath) && !strings.HasSuffix(f.File, "_test.go")
}

// frameText formats a frame as FILE:LINE in FUNC, FUNC without its import path.
func frameText(f runtime.Frame) string {
	return f.File + ":" + strconv.Itoa(f.Line) + " in " + f.Function[strings.LastIndexByte(f.Function, '/')+1:]
}

// funcPackage returns the import path of a function's package, from its
// full name such as example.com/p.T.Method.
func funcPackage(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	if dot := strings.IndexByte(fn[slash+1:], '.'); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}
