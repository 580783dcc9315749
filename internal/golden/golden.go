// Package golden compares what a test produced with a golden file kept in
// the repository, usually under testdata.
//
// A test hands Compare the file's path and its output; a mismatch fails
// the test with the first line where the two part, and the lines around it.
// The package registers the test binary's -update flag: with it, Compare
// writes the output to the file instead, so after a deliberate change
//
//	go test ./backends/nftables/ -update
//
// rewrites that package's golden files (add -run to limit it to some
// tests), and git diff shows what changed. A test package that imports
// golden must not register an update flag of its own.
//
// Only tests import this package: internal/layering checks it.
package golden

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files with what the tests produce")

// Compare fails t unless got equals the golden file at path.
// With -update it writes got to path, and the directory if need be.
func Compare[T ~string | ~[]byte](t testing.TB, path string, got T) {
	t.Helper()
	if err := compare(path, []byte(got), *update); err != nil {
		t.Error(err)
	}
}

// compare writes got to path if update is set, and otherwise returns an
// error describing how got differs from the file.
func compare(path string, got []byte, update bool) error {
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, got, 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w (go test -update writes it)", err)
	}
	if d := diff(string(want), string(got)); d != "" {
		return fmt.Errorf("golden file %s differs (go test -update rewrites it):\n%s", path, d)
	}
	return nil
}

// around is how many lines diff shows before and from the first difference.
const around = 3

// diff describes the first line where got departs from want, with the
// common lines before it and a few lines of each from there; it returns ""
// when the two are equal.
func diff(want, got string) string {
	if want == got {
		return ""
	}
	w, g := slices.Collect(strings.Lines(want)), slices.Collect(strings.Lines(got))
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "first difference at line %d (the file has %d lines, the test produced %d)\n", i+1, len(w), len(g))
	for j := max(0, i-around); j < i; j++ {
		fmt.Fprintf(&b, "  %4d  %s\n", j+1, show(w[j]))
	}
	excerpt(&b, "-", w, i)
	excerpt(&b, "+", g, i)
	b.WriteString("(- the golden file, + the test's output)\n")
	return b.String()
}

// excerpt writes up to around lines of ls from index from, each marked.
func excerpt(b *strings.Builder, mark string, ls []string, from int) {
	if from >= len(ls) {
		fmt.Fprintf(b, "%s       (end of file)\n", mark)
		return
	}
	for j := from; j < min(len(ls), from+around); j++ {
		fmt.Fprintf(b, "%s %4d  %s\n", mark, j+1, show(ls[j]))
	}
}

// show returns a line without its newline, quoted when white space at its
// end, or a missing newline, would otherwise be invisible.
func show(line string) string {
	text, ok := strings.CutSuffix(line, "\n")
	if !ok {
		return strconv.Quote(text) + " (no newline at the end)"
	}
	if strings.TrimRight(text, " \t\r") != text {
		return strconv.Quote(text)
	}
	return text
}
