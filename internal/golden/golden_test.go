package golden

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	tests := []struct {
		name, want, got string
		// lines are what the description must hold, in order.
		lines []string
	}{
		{"equal", "a\nb\n", "a\nb\n", nil},
		{"changed line", "1\n2\n3\n4\n5\n6\n", "1\n2\n3\n4\nfive\n6\n", []string{
			"first difference at line 5 (the file has 6 lines, the test produced 6)",
			"     2  2", "     3  3", "     4  4",
			"-    5  5", "-    6  6",
			"+    5  five", "+    6  6",
		}},
		{"output longer", "a\n", "a\nb\n", []string{"line 2", "     1  a", "-       (end of file)", "+    2  b"}},
		{"output shorter", "a\nb\n", "", []string{"line 1", "-    1  a", "+       (end of file)"}},
		{"missing newline", "a\n", "a", []string{"line 1", "-    1  a", `+    1  "a" (no newline at the end)`}},
		{"trailing space", "a\n", "a \n", []string{"-    1  a", `+    1  "a "`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := diff(tt.want, tt.got)
			if (d == "") != (tt.lines == nil) {
				t.Fatalf("diff(%q, %q) = %q", tt.want, tt.got, d)
			}
			rest := d
			for _, l := range tt.lines {
				i := strings.Index(rest, l)
				if i < 0 {
					t.Fatalf("the description lacks %q after what came before:\n%s", l, d)
				}
				rest = rest[i+len(l):]
			}
		})
	}
}

func TestDiffShowsThreeLinesOfEach(t *testing.T) {
	d := diff("x\n1\n2\n3\n4\n", "y\n1\n2\n3\n4\n")
	if strings.Contains(d, "    4  3") || !strings.Contains(d, "-    3  2") {
		t.Errorf("want lines 1 to 3 of each and no more:\n%s", d)
	}
}

func TestCompare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "testdata", "out.golden")
	if err := compare(path, []byte("x\n"), false); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "-update") {
		t.Errorf("missing file: %v, want a not-exist error naming -update", err)
	}
	if err := compare(path, []byte("x\n"), true); err != nil {
		t.Fatalf("update: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "x\n" {
		t.Fatalf("after update the file holds %q, %v", b, err)
	}
	if err := compare(path, []byte("x\n"), false); err != nil {
		t.Errorf("same output: %v", err)
	}
	err := compare(path, []byte("y\n"), false)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "+    1  y") {
		t.Errorf("other output: %v, want the path and the diff", err)
	}
}

func TestCompareAcceptsStringsAndBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.golden")
	if err := os.WriteFile(path, []byte("same\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Compare(t, path, "same\n")
	Compare(t, path, []byte("same\n"))
}

func TestUpdateFlagRegistered(t *testing.T) {
	if flag.Lookup("update") == nil {
		t.Error("the package registers no -update flag")
	}
}
