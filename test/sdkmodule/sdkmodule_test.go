// Package sdkmodule checks that the plugin SDK is a module of its own that
// a plugin author's module can require by its path and version, as `go get
// github.com/weirproxy/weir/sdk@VERSION` fetches it: the sdk folder is
// served from a module proxy in a temporary folder (GOPROXY=file://), and
// a plugin written outside this repository is tested and built for wasip1
// against it, with no replace directive and no access to the rest of the
// repository.
package sdkmodule

import (
	"archive/zip"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	sdkPath    = "github.com/weirproxy/weir/sdk"
	sdkVersion = "v0.1.0"
)

// TestPluginOutsideTheRepository builds a plugin module that requires the
// SDK by version, tests it with sdktest and builds it for wasip1.
func TestPluginOutsideTheRepository(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin with the go command: not with -short")
	}
	proxy := serveSDK(t, filepath.Join("..", "..", "sdk"))
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":       "module example.com/lastone\n\ngo 1.26\n\nrequire " + sdkPath + " " + sdkVersion + "\n",
		"main.go":      pluginSource,
		"main_test.go": pluginTest,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := moduleEnv(t, proxy)
	goCommand(t, dir, env, "mod", "tidy")
	goCommand(t, dir, env, "test", "./...")
	wasm := filepath.Join(t.TempDir(), "lastone.wasm")
	goCommand(t, dir, append(env, "GOOS=wasip1", "GOARCH=wasm"), "build", "-buildmode=c-shared", "-o", wasm, ".")
	if info, err := os.Stat(wasm); err != nil || info.Size() == 0 {
		t.Fatalf("the plugin built outside the repository is missing or empty: %v", err)
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil || !strings.Contains(string(sum), sdkPath+" "+sdkVersion+" h1:") {
		t.Errorf("go.sum does not hold the SDK's hash (%v):\n%s", err, sum)
	}
}

// serveSDK writes a file-based module proxy holding the module in dir as
// sdkPath@sdkVersion and returns its URL.
func serveSDK(t *testing.T, dir string) string {
	t.Helper()
	root := t.TempDir()
	at := filepath.Join(root, filepath.FromSlash(sdkPath), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info := `{"Version":"` + sdkVersion + `","Time":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
	for name, text := range map[string]string{"list": sdkVersion + "\n", sdkVersion + ".info": info, sdkVersion + ".mod": string(mod)} {
		if err := os.WriteFile(filepath.Join(at, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeModuleZip(t, dir, filepath.Join(at, sdkVersion+".zip"))
	return "file://" + filepath.ToSlash(root)
}

// writeModuleZip zips the module in dir as the go command expects: every
// file under the prefix path@version/, but nested modules, other
// languages' build folders and hidden folders.
func writeModuleZip(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zip.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			return skipDir(dir, path, rel, d.Name())
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		w, err := z.Create(sdkPath + "@" + sdkVersion + "/" + filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

// skipDir says which folders a module zip leaves out.
func skipDir(root, path, rel, name string) error {
	if rel == "." {
		return nil
	}
	if strings.HasPrefix(name, ".") || name == "node_modules" || name == "target" || name == "vendor" {
		return filepath.SkipDir
	}
	if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
		return filepath.SkipDir
	}
	return nil
}

// moduleEnv is the environment of a go command that may fetch modules
// only from proxy, into a module cache of its own.
func moduleEnv(t *testing.T, proxy string) []string {
	t.Helper()
	cache := t.TempDir()
	t.Cleanup(func() {
		// The module cache is read-only; the go command empties it.
		cmd := exec.Command("go", "clean", "-modcache")
		cmd.Env = append(os.Environ(), "GOMODCACHE="+cache)
		_ = cmd.Run()
	})
	return append(os.Environ(), "GOPROXY="+proxy, "GOMODCACHE="+cache, "GOSUMDB=off", "GOWORK=off",
		"GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOPRIVATE=", "GONOSUMDB=", "GONOPROXY=")
}

func goCommand(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// pluginSource is a plugin as an author writes it in a module of their
// own: it keeps only the last endpoint of every service.
const pluginSource = `package main

import (
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

var lastOne = guest.Plugin{Process: func(b *abi.Batch) error {
	for i := range b.Len() {
		s := b.Service(i)
		last := s.Len() - 1
		n := 0
		s.Keep(func(abi.Endpoint) bool { n++; return n-1 == last })
	}
	return nil
}}

func init() { guest.Register(lastOne) }

func main() {}
`

// pluginTest is the plugin's own test, run natively with sdktest.
const pluginTest = `package main

import (
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

func TestLastOne(t *testing.T) {
	web := sdktest.Service("shop", "web", "10.96.0.10", 80,
		sdktest.Endpoint("10.244.1.5", 8080, "node-a", "zone-a", "web-1"),
		sdktest.Endpoint("10.244.1.6", 8080, "node-b", "zone-a", "web-2"))
	out, err := sdktest.Run(lastOne, "", plan.Node{Name: "node-a"}, web)
	if err != nil {
		t.Fatal(err)
	}
	if len(out[0].Endpoints) != 1 || out[0].Endpoints[0].Pod != "web-2" {
		t.Fatalf("got %v, want only web-2", out[0].Endpoints)
	}
}
`
