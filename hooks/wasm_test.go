package hooks

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// Hand-assembled modules, for what no compiler emits: a plugin that grows
// its table, or recurses as deep as wazero lets it.

// rawModule assembles a minimal plugin: weir_abi_version returns 1,
// weir_alloc hands out offset 1024 of an eight-page (512 KiB) memory, weir_free does
// nothing and weir_process (ptr, len) -> i64, with one extra i32 local,
// runs the code process (without its final end). tables is the table
// section's body; nil declares none.
func rawModule(tables, process []byte) []byte {
	u := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	vec := func(items ...[]byte) []byte {
		out := u(uint64(len(items)))
		for _, it := range items {
			out = append(out, it...)
		}
		return out
	}
	str := func(s string) []byte { return append(u(uint64(len(s))), s...) }
	section := func(id byte, body []byte) []byte { return append(append([]byte{id}, u(uint64(len(body)))...), body...) }
	body := func(code ...byte) []byte { return append(u(uint64(len(code))), code...) }
	const i32, i64 = 0x7f, 0x7e

	m := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	m = append(m, section(1, vec( // types
		[]byte{0x60, 0, 1, i32},           // () -> i32
		[]byte{0x60, 1, i32, 1, i32},      // (i32) -> i32
		[]byte{0x60, 1, i32, 0},           // (i32) -> ()
		[]byte{0x60, 2, i32, i32, 1, i64}, // (i32, i32) -> i64
	))...)
	m = append(m, section(3, vec([]byte{0}, []byte{1}, []byte{2}, []byte{3}))...) // functions
	if tables != nil {
		m = append(m, section(4, tables)...)
	}
	m = append(m, section(5, vec([]byte{0x00, 8}))...) // memory: min 8 pages
	m = append(m, section(7, vec(                      // exports
		append(str("memory"), 0x02, 0),
		append(str(exportVersion), 0x00, 0),
		append(str(exportAlloc), 0x00, 1),
		append(str(exportFree), 0x00, 2),
		append(str(exportProcess), 0x00, 3),
	))...)
	m = append(m, section(10, vec( // code
		body(0, 0x41, 1, 0x0b),          // i32.const 1
		body(0, 0x41, 0x80, 0x08, 0x0b), // i32.const 1024
		body(0, 0x0b),                   // nothing
		body(append([]byte{1, 1, i32}, append(process, 0x0b)...)...),
	))...)
	return m
}

// tableGrower is weir_process code that grows table 0 by 2^20 elements
// (8 MiB of host memory each time) up to 128 times, stopping when a grow
// is refused, and returns status Failed.
var tableGrower = []byte{
	0x02, 0x40, // block
	0x03, 0x40, // loop
	0xd0, 0x70, // ref.null func
	0x41, 0x80, 0x80, 0xc0, 0x00, // i32.const 1<<20
	0xfc, 0x0f, 0x00, // table.grow 0
	0x41, 0x7f, // i32.const -1
	0x46,       // i32.eq
	0x0d, 0x01, // br_if 1: refused
	0x20, 0x02, // local.get 2
	0x41, 0x01, // i32.const 1
	0x6a,       // i32.add
	0x22, 0x02, // local.tee 2
	0x41, 0x80, 0x01, // i32.const 128
	0x49,       // i32.lt_u
	0x0d, 0x00, // br_if 0
	0x0b, 0x0b, // end loop, end block
	0x42, 0x03, // i64.const 3 (status Failed)
}

// goLikeTable is a table section like a Go guest's: one funcref table
// with a minimum and no maximum.
var goLikeTable = []byte{1, 0x70, 0x00, 0x01}

// writeModule writes a module into the test's directory and returns its path.
func writeModule(t testing.TB, name string, module []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".wasm")
	if err := os.WriteFile(path, module, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
