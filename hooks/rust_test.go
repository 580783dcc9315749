package hooks_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// The toolchain CI uses: Debian's rustc with the wasm32-wasi standard library
// from libstd-rust-dev-wasm32 (a rustup toolchain on PATH usually lacks that
// target) and its linker, rustc's symlink to lld-14 (only recommended by the
// packages). The linker is passed explicitly so that PATH does not matter.
const (
	debianRustc = "/usr/bin/rustc"
	debianLLD   = "/usr/bin/rust-lld"
)

// factorAnnotation is the annotation plugins/local-boost reads.
const factorAnnotation = "local-boost.weir.dev/factor"

// rustNode is the node the test's batches are for; endpoints on it are local.
var rustNode = plan.Node{Name: "node-a", Zone: "zone-1"}

// TestRustLocalBoost runs plugins/local-boost, a plugin written in Rust
// against docs/plugin-abi.md without the Go SDK, through the real host.
func TestRustLocalBoost(t *testing.T) {
	wasm := buildLocalBoost(t)
	t.Run("Boost", func(t *testing.T) { testRustBoost(t, wasm) })
	t.Run("LaterBatch", func(t *testing.T) { testRustLaterBatch(t, wasm) })
	t.Run("RefusesConfig", func(t *testing.T) { testRustRefusesConfig(t, wasm) })
}

// testRustBoost checks which services the plugin boosts and which it leaves alone.
func testRustBoost(t *testing.T, wasm string) {
	chain, log := newRustChain(t, wasm)

	boosted := withFactor(rustService("web", "node-a", "node-b", "node-a", "node-c"), "4")
	boosted.Endpoints[2].Weight = 3
	saturated := withFactor(rustService("big", "node-a", "node-b"), "100")
	saturated.Endpoints[0].Weight = math.MaxUint32 / 10
	unchanged := []*plan.Service{
		withFactor(rustService("drained", "node-a"), "2"),
		rustService("plain", "node-a", "node-b"),
		withFactor(rustService("remote", "node-b", "node-c"), "5"),
	}
	unchanged[0].Endpoints[0].Weight = 0
	invalid := []string{"1", "101", "four", "", "+5", "4 ", "0x10"}
	for i, factor := range invalid {
		unchanged = append(unchanged, withFactor(rustService(fmt.Sprintf("bad-%d", i), "node-a", "node-b"), factor))
	}
	in := append([]*plan.Service{boosted, saturated}, unchanged...)
	before := make([]*plan.Service, len(in))
	for i, s := range in {
		before[i] = s.Clone()
	}

	out, err := chain.Apply(t.Context(), rustNode, in, true)
	if err != nil {
		t.Fatalf("Apply: %v\nlog:\n%s", err, log)
	}
	if len(out) != len(in) {
		t.Fatalf("Apply returned %d services for %d", len(out), len(in))
	}
	checkWeights(t, out[0], boosted, 4, 1, 12, 1)
	checkWeights(t, out[1], saturated, math.MaxUint32, 1)
	for i, s := range unchanged {
		if out[2+i] != s {
			t.Errorf("%s: got a new service %v, want the input itself", s.Key, out[2+i])
		}
	}
	for i, s := range in {
		if !s.Equal(before[i]) {
			t.Errorf("%s: Apply modified its input", s.Key)
		}
	}
	reasons := make([]string, len(invalid))
	for i, factor := range invalid {
		reasons[i] = fmt.Sprintf("service default/bad-%d:http/TCP: annotation %s is %q, want an integer from 2 to 100; left unchanged",
			i, factorAnnotation, factor)
	}
	log.waitFor(t, reasons...)
}

// testRustLaterBatch checks that the plugin keeps serving batches of
// changed services after a large first one.
func testRustLaterBatch(t *testing.T, wasm string) {
	chain, log := newRustChain(t, wasm)

	first := make([]*plan.Service, 2000)
	for i := range first {
		first[i] = withFactor(rustService(fmt.Sprintf("svc-%04d", i), "node-b", "node-a", "node-c"), "3")
	}
	out, err := chain.Apply(t.Context(), rustNode, first, true)
	if err != nil {
		t.Fatalf("first Apply: %v\nlog:\n%s", err, log)
	}
	for i := range first {
		checkWeights(t, out[i], first[i], 1, 3, 1)
	}
	changed := withFactor(first[7].Clone(), "10")
	out, err = chain.Apply(t.Context(), rustNode, []*plan.Service{changed}, false)
	if err != nil {
		t.Fatalf("second Apply: %v\nlog:\n%s", err, log)
	}
	checkWeights(t, out[0], changed, 1, 10, 1)
}

// testRustRefusesConfig checks that the plugin's weir_configure refuses
// anything but an absent config, which stops a closed-policy chain.
func testRustRefusesConfig(t *testing.T, wasm string) {
	log := &logRecorder{}
	chain, err := hooks.New(t.Context(), []hooks.Config{{
		Name: "local-boost", Path: wasm, FailurePolicy: hooks.PolicyClosed,
		Config: map[string]any{"factor": 3},
	}}, hooks.Options{Log: slog.New(log)})
	if err == nil {
		chain.Close(context.Background())
		t.Fatal("New accepted a config the plugin refuses")
	}
	t.Logf("New: %v", err)
	if !strings.Contains(err.Error(), "local-boost") {
		t.Errorf("error %q does not name the plugin", err)
	}
	const want = "config must be null"
	if !strings.Contains(err.Error(), want) {
		log.waitFor(t, want)
	}
}

// newRustChain loads the Rust plugin into a chain of its own, closed when
// the test ends.
func newRustChain(t *testing.T, wasm string) (*hooks.Chain, *logRecorder) {
	t.Helper()
	log := &logRecorder{}
	chain, err := hooks.New(t.Context(), []hooks.Config{{Name: "local-boost", Path: wasm, Timeout: 5 * time.Second}},
		hooks.Options{Log: slog.New(log)})
	if err != nil {
		t.Fatalf("loading the Rust plugin: %v\nlog:\n%s", err, log)
	}
	t.Cleanup(func() {
		if err := chain.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return chain, log
}

// buildLocalBoost compiles plugins/local-boost with Debian's rustc into a
// temporary directory and returns the .wasm path. It skips the test when the
// toolchain is missing, and fails it instead when CI=true.
func buildLocalBoost(t *testing.T) string {
	t.Helper()
	if reason := rustMissing(t); reason != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(reason)
		}
		t.Skip(reason)
	}
	out := filepath.Join(t.TempDir(), "local-boost.wasm")
	cmd := exec.CommandContext(t.Context(), debianRustc, "--edition", "2021", "--target", "wasm32-wasi",
		"--crate-type", "cdylib", "-C", "opt-level=s", "-C", "lto", "-C", "strip=symbols",
		"-C", "linker="+debianLLD, "-o", out, filepath.Join("..", "plugins", "local-boost", "src", "lib.rs"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, msg)
	}
	return out
}

// rustMissing says why the Rust plugin cannot be built here, or returns "".
func rustMissing(t *testing.T) string {
	const install = "install Debian's rustc, libstd-rust-dev-wasm32 and lld-14 to test the Rust plugin"
	for _, file := range []string{debianRustc, debianLLD} {
		if _, err := os.Stat(file); err != nil { // Stat follows rust-lld's symlink to lld-14
			return file + " is missing: " + install
		}
	}
	sysroot, err := exec.CommandContext(t.Context(), debianRustc, "--print", "sysroot").Output()
	if err != nil {
		return debianRustc + " --print sysroot failed (" + err.Error() + "): " + install
	}
	lib := filepath.Join(strings.TrimSpace(string(sysroot)), "lib", "rustlib", "wasm32-wasi", "lib")
	if std, _ := filepath.Glob(filepath.Join(lib, "libstd-*.rlib")); len(std) == 0 {
		return "no wasm32-wasi standard library in " + lib + ": " + install
	}
	return ""
}

// rustService returns the service default/name:http/TCP with one endpoint
// on each of the nodes, local when on rustNode, and an unrelated annotation.
func rustService(name string, nodes ...string) *plan.Service {
	eps := make([]plan.Endpoint, len(nodes))
	for i, node := range nodes {
		eps[i] = sdktest.Endpoint(fmt.Sprintf("10.1.0.%d", i+1), 8080, node, "zone-1", fmt.Sprintf("%s-%d", name, i))
		eps[i].Local = node == rustNode.Name
	}
	s := sdktest.Service("default", name, "10.0.0.1", 80, eps...)
	s.Key.Port = "http"
	s.Annotations = map[string]string{"example.com/other": "x"}
	return s
}

// withFactor sets s's factor annotation (on a new map: annotation maps are
// shared between clones) and returns s.
func withFactor(s *plan.Service, factor string) *plan.Service {
	a := map[string]string{factorAnnotation: factor}
	for k, v := range s.Annotations {
		if k != factorAnnotation {
			a[k] = v
		}
	}
	s.Annotations = a
	return s
}

// checkWeights checks that got is a new copy of in whose endpoints have the
// given weights and are otherwise in's.
func checkWeights(t *testing.T, got, in *plan.Service, weights ...uint32) {
	t.Helper()
	if got == in {
		t.Errorf("%s: got the input itself, want weights %v", in.Key, weights)
		return
	}
	if got == nil || len(got.Endpoints) != len(weights) || !sameButEndpoints(got, in) {
		t.Errorf("%s: got %v, want the input with weights %v", in.Key, got, weights)
		return
	}
	for i, w := range weights {
		want := in.Endpoints[i]
		want.Weight = w
		if got.Endpoints[i] != want {
			t.Errorf("%s: endpoint %d is %+v, want %+v", in.Key, i, got.Endpoints[i], want)
		}
	}
}

// sameButEndpoints reports whether a and b are equal but for their endpoints.
func sameButEndpoints(a, b *plan.Service) bool {
	x, y := *a, *b
	x.Endpoints, y.Endpoints = nil, nil
	return x.Equal(&y)
}

// logRecorder is a slog.Handler keeping every record's message and string
// attribute values verbatim, so tests can look for a plugin's stderr line
// however the host logs it.
type logRecorder struct {
	mu    sync.Mutex
	texts []string
}

// Enabled records every level.
func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps the record's message and attribute values.
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.texts = append(r.texts, rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		r.texts = append(r.texts, a.Value.String())
		return true
	})
	return nil
}

// WithAttrs keeps the attributes' values and returns r itself.
func (r *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range attrs {
		r.texts = append(r.texts, a.Value.String())
	}
	return r
}

// WithGroup returns r: groups do not matter to the tests.
func (r *logRecorder) WithGroup(string) slog.Handler { return r }

// String returns everything recorded, one text a line.
func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.texts, "\n")
}

// missing returns the wants that no recorded text contains.
func (r *logRecorder) missing(wants []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(wants), func(want string) bool {
		return slices.ContainsFunc(r.texts, func(s string) bool { return strings.Contains(s, want) })
	})
}

// waitFor waits up to 5 s until every want is in some log record.
func (r *logRecorder) waitFor(t *testing.T, wants ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for missing := r.missing(wants); len(missing) > 0; missing = r.missing(wants) {
		if time.Now().After(deadline) {
			t.Errorf("the log has no %q; log:\n%s", missing, r)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
