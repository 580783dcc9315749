// Package layering holds the test that keeps Weir's import graph as
// docs/architecture.md draws it: dependencies point down the pipeline and
// never back up.
package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/weirproxy/weir"

// rule forbids the packages under from, and their own dependencies, to
// depend on any package under one of the prefixes of not.
type rule struct {
	from string
	not  []string
	why  string
}

var rules = []rule{
	{module + "/backends", []string{"k8s.io/client-go", module + "/core", module + "/hooks"},
		"backends turn plans into kernel state: no Kubernetes client, no pipeline stage above them"},
	{module + "/hooks", []string{module + "/backends", "k8s.io/client-go"},
		"hooks see plan services only"},
	{module + "/core/planner", []string{module + "/backends", module + "/hooks", "k8s.io/client-go"},
		"the planner is pure: it never touches the kernel or the plugins"},
	{module + "/core/tracker", []string{module + "/backends", module + "/hooks", module + "/core/planner"},
		"the tracker only merges changes"},
	{module, []string{module + "/cmd"}, "cmd/ is wiring: nothing imports it"},
}

// TestLayering checks every package of the module against rules, with
// `go list` (test files aside).
func TestLayering(t *testing.T) {
	deps := listDeps(t, filepath.Join("..", ".."), "./...")
	for pkg, ds := range deps {
		for _, r := range rules {
			if !under(pkg, r.from) || under(pkg, module+"/cmd") && r.from == module {
				continue
			}
			for _, d := range ds {
				for _, bad := range r.not {
					if under(d, bad) {
						t.Errorf("%s depends on %s: %s", pkg, d, r.why)
					}
				}
			}
		}
	}
	if len(deps) < 20 {
		t.Fatalf("go list found %d packages; want the whole module", len(deps))
	}
}

// TestGoldenOnlyInTests keeps internal/golden, which registers the test
// binary's -update flag, out of every package's own imports: only test
// files use it.
func TestGoldenOnlyInTests(t *testing.T) {
	for pkg, ds := range listDeps(t, filepath.Join("..", ".."), "./...") {
		if slices.Contains(ds, module+"/internal/golden") {
			t.Errorf("%s depends on internal/golden, which is test support", pkg)
		}
	}
}

// TestSDKImportsOnlyTheStandardLibrary keeps the plugin SDK free of
// dependencies: any guest language's toolchain can mirror it, and the host
// shares its plan types.
func TestSDKImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-C", filepath.Join("..", "..", "sdk"), "-deps",
		"-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list in sdk: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if !under(p, module+"/sdk") {
			t.Errorf("the SDK depends on %s, which is not in the standard library", p)
		}
	}
}

// listDeps returns, for each package matched by pattern in dir, its
// transitive dependencies.
func listDeps(t *testing.T, dir, pattern string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-C", dir, "-f", `{{.ImportPath}} {{join .Deps " "}}`, pattern).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			deps[f[0]] = f[1:]
		}
	}
	return deps
}

// under says whether package p is prefix or inside it.
func under(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}
