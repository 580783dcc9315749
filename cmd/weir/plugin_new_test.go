package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goIn runs the go tool in dir with extra environment variables.
func goIn(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS=-mod=mod"}, env...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, b)
	}
}

// TestPluginNewGo generates a Go plugin, points it at this checkout's SDK
// as its README says, and checks that its tests pass, that it builds for
// wasip1 and that weir plugin test runs the result.
func TestPluginNewGo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "skel")
	code, stdout, stderr := invoke(t, "plugin", "new", "--lang", "go", "my-plugin", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "wrote the go plugin my-plugin in "+dir) {
		t.Errorf("stdout %q does not say what it wrote", stdout)
	}
	for _, f := range []string{"main.go", "main_test.go", "go.mod", "README.md", "config.yaml", "testdata/config.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("skeleton lacks %s: %v", f, err)
		}
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "module example.com/my-plugin\n") ||
		!strings.Contains(string(mod), "require github.com/weirproxy/weir/sdk ") || strings.Contains(string(mod), "replace") {
		t.Errorf("go.mod:\n%s", mod)
	}
	sdk, err := filepath.Abs("../../sdk")
	if err != nil {
		t.Fatal(err)
	}
	goIn(t, dir, nil, "mod", "edit", "-replace", "github.com/weirproxy/weir/sdk="+sdk)
	goIn(t, dir, nil, "vet", "./...")
	goIn(t, dir, nil, "test", "./...")
	wasm := filepath.Join(dir, "my-plugin.wasm")
	goIn(t, dir, []string{"GOOS=wasip1", "GOARCH=wasm"}, "build", "-buildmode=c-shared", "-o", wasm, ".")
	code, stdout, stderr = invoke(t, "plugin", "test", "--plugin", wasm, "--config", filepath.Join(dir, "testdata", "config.yaml"),
		"--manifests", copyDemo(t), "--node-name", demoNode)
	if code != 0 || !strings.Contains(stdout, "my-plugin changed 0 of 2 services") {
		t.Errorf("weir plugin test on the skeleton: exit %d:\n%s\n%s", code, stdout, stderr)
	}
}

// TestPluginNewRust generates a Rust plugin against this checkout's SDK
// and checks, with Debian's Rust toolchain as its Makefile uses it, that
// its tests pass on the batch weir plugin new wrote, that it builds for
// wasm32-wasi and that weir plugin test runs the result.
func TestPluginNewRust(t *testing.T) {
	requireDebianRust(t)
	dir := filepath.Join(t.TempDir(), "skel")
	code, stdout, stderr := invoke(t, "plugin", "new", "--lang", "rust", "--sdk-dir", "../../sdk", "my-drain", dir)
	if code != 0 || !strings.Contains(stdout, "wrote the rust plugin my-drain in "+dir) {
		t.Fatalf("exit %d:\n%s\n%s", code, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "make", "-C", dir, "test", "build", "RUSTC=/usr/bin/rustc", "LLD=/usr/bin/rust-lld").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "test result: ok. 2 passed") {
		t.Fatalf("make test build in the skeleton: %v\n%s", err, out)
	}
	code, stdout, stderr = invoke(t, "plugin", "test", "--plugin", filepath.Join(dir, "my-drain.wasm"),
		"--manifests", copyDemo(t), "--node-name", demoNode)
	if code != 0 || !strings.Contains(stdout, "my-drain changed 0 of 2 services") {
		t.Errorf("weir plugin test on the skeleton: exit %d:\n%s\n%s", code, stdout, stderr)
	}
}

// TestPluginNewAssemblyScript generates an AssemblyScript plugin against
// this checkout's SDK and runs its npm test, which builds it with the
// compiler from npm and runs it in weir plugin test against its golden
// file: the built weir is on the PATH as the README asks.
func TestPluginNewAssemblyScript(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " is missing: install Node.js 20 or later and npm"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	weir := buildWeir(t)
	dir := filepath.Join(t.TempDir(), "skel")
	code, stdout, stderr := invoke(t, "plugin", "new", "--lang", "assemblyscript", "--sdk-dir", "../../sdk", "my-as", dir)
	if code != 0 || !strings.Contains(stdout, "wrote the assemblyscript plugin my-as in "+dir) {
		t.Fatalf("exit %d:\n%s\n%s", code, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := append(os.Environ(), "PATH="+filepath.Dir(weir)+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, args := range [][]string{{"install", "--no-audit", "--no-fund", "--prefer-offline"}, {"test"}} {
		cmd := exec.CommandContext(ctx, "npm", args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %s in the skeleton: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "my-as.wasm")); err != nil {
		t.Errorf("npm test built no my-as.wasm: %v", err)
	}
}

// requireDebianRust skips the test without Debian's Rust toolchain for
// wasm32-wasi, or fails it under CI=true.
func requireDebianRust(t *testing.T) {
	t.Helper()
	for _, f := range []string{"/usr/bin/rustc", "/usr/bin/rust-lld"} {
		if _, err := os.Stat(f); err != nil {
			msg := f + " is missing: install Debian's rustc, libstd-rust-dev-wasm32 and lld"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

func TestPluginNewOptions(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := invoke(t, "plugin", "new", "--lang", "go", "--sdk-dir", "../../sdk", "--module", "example.org/x/p", "p", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	sdk, _ := filepath.Abs("../../sdk")
	for _, want := range []string{"module example.org/x/p\n", "replace github.com/weirproxy/weir/sdk => " + sdk + "\n"} {
		if !strings.Contains(string(mod), want) {
			t.Errorf("go.mod lacks %q:\n%s", want, mod)
		}
	}
	code, _, stderr = invoke(t, "plugin", "new", "--lang", "go", "p", dir)
	if code != exitFailed || !strings.Contains(stderr, "exists; use --force") {
		t.Errorf("over an existing skeleton: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr = invoke(t, "plugin", "new", "--lang", "go", "--force", "p", dir); code != 0 {
		t.Errorf("with --force: exit %d, stderr %q", code, stderr)
	}
}

func TestPluginNewErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--lang", "cobol", "p"}, exitUsage, `--lang "cobol": unknown; use assemblyscript, go, rust`},
		{[]string{"p"}, exitUsage, "needs --lang"},
		{[]string{"--lang", "go"}, exitUsage, "NAME [DIR]"},
		{[]string{"--lang", "go", "Bad_Name"}, exitUsage, `plugin name "Bad_Name"`},
	} {
		code, _, stderr := invoke(t, append([]string{"plugin", "new"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
