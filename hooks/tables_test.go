package hooks

import (
	"bytes"
	"strings"
	"testing"
)

// TestBoundTables shows what boundTables makes of a module's tables: one
// without a maximum gets its minimum, one with a maximum keeps it, too many
// elements in all or a kind of table Weir does not know are refused, and a
// module without tables or one it cannot read passes unchanged.
func TestBoundTables(t *testing.T) {
	const limit = 4 << 20 // allows 16384 elements
	cases := []struct {
		name   string
		tables []byte // the table section's body
		want   []byte // the body after boundTables; nil when refused
		err    string
	}{
		{"no maximum", []byte{1, 0x70, 0x00, 0xdb, 0x32}, []byte{1, 0x70, 0x01, 0xdb, 0x32, 0xdb, 0x32}, ""},
		{"a maximum", []byte{1, 0x70, 0x01, 0x01, 0x80, 0x01}, []byte{1, 0x70, 0x01, 0x01, 0x80, 0x01}, ""},
		{"two tables", []byte{2, 0x70, 0x00, 0x05, 0x6f, 0x01, 0x00, 0x02}, []byte{2, 0x70, 0x01, 0x05, 0x05, 0x6f, 0x01, 0x00, 0x02}, ""},
		{"at the bound", []byte{1, 0x70, 0x01, 0x00, 0x80, 0x80, 0x01}, []byte{1, 0x70, 0x01, 0x00, 0x80, 0x80, 0x01}, ""},
		{"over the bound", []byte{1, 0x70, 0x01, 0x00, 0x81, 0x80, 0x01}, nil,
			"tables: they may hold 16385 elements, more than the 16384 (8 bytes of host memory each) that a memoryLimit of 4 MiB allows"},
		{"over the bound in all", []byte{2, 0x70, 0x00, 0x81, 0x40, 0x70, 0x00, 0x81, 0x40}, nil, "tables: they may hold 16386 elements"},
		{"64-bit table", []byte{1, 0x70, 0x04, 0x01}, nil, "tables: table 0: limits of kind 0x4 are not ones Weir accepts"},
		{"typed reference", []byte{1, 0x64, 0x70, 0x00, 0x01}, nil, "tables: table 0: element type 0x64 is not one Weir accepts (funcref or externref)"},
		{"cut short", []byte{2, 0x70, 0x00, 0x01}, nil, "tables: table 1: cut short"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := boundTables(rawModule(tc.tables, tableGrower), limit)
			switch {
			case tc.want == nil && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("boundTables returned %v, want an error with %q", err, tc.err)
			case tc.want == nil:
			case err != nil:
				t.Fatalf("boundTables: %v", err)
			case !bytes.Equal(got, rawModule(tc.want, tableGrower)):
				t.Errorf("boundTables returned\n% x\nwant\n% x", got, rawModule(tc.want, tableGrower))
			}
		})
	}
	for _, module := range [][]byte{rawModule(nil, tableGrower), []byte("\x00asm\x01\x00\x00\x00\x04\xff"), []byte("nope")} {
		if got, err := boundTables(module, limit); err != nil || !bytes.Equal(got, module) {
			t.Errorf("boundTables(% x) = % x, %v; want it unchanged", module, got, err)
		}
	}
}

// TestLoadBoundedTables shows the refusal as New reports it, naming the
// plugin and its file.
func TestLoadBoundedTables(t *testing.T) {
	path := writeModule(t, "bigtable", rawModule([]byte{1, 0x70, 0x00, 0x81, 0x80, 0x04}, tableGrower))
	got := newErr(t, Config{Name: "bigtable", Path: path, FailurePolicy: PolicyClosed, MemoryLimit: 16 << 20})
	want := `plugin "bigtable": ` + path + ": tables: they may hold 65537 elements, " +
		"more than the 65536 (8 bytes of host memory each) that a memoryLimit of 16 MiB allows"
	if got != want {
		t.Errorf("New returned\n%s\nwant\n%s", got, want)
	}
}
