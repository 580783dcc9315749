package hooks_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/abi"
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

// rustSDK is the Rust SDK's crate root, relative to this package.
var rustSDK = filepath.Join("..", "sdk", "rust", "src", "lib.rs")

// factorAnnotation is the annotation plugins/local-boost reads.
const factorAnnotation = "local-boost.weir.dev/factor"

// rustNode is the node the test's batches are for; endpoints on it are local.
var rustNode = plan.Node{Name: "node-a", Zone: "zone-1"}

// TestRustLocalBoost runs plugins/local-boost, a plugin written in Rust
// with the Rust SDK (sdk/rust), through the real host.
func TestRustLocalBoost(t *testing.T) {
	wasm := buildLocalBoost(t)
	t.Run("Boost", func(t *testing.T) { testRustBoost(t, wasm) })
	t.Run("LaterBatch", func(t *testing.T) { testRustLaterBatch(t, wasm) })
	t.Run("RefusesConfig", func(t *testing.T) { testRustRefusesConfig(t, wasm) })
	t.Run("Signals", func(t *testing.T) {
		boosted := withFactor(rustService("web", "node-a", "node-b"), "4")
		testWithSignals(t, "local-boost", wasm, []*plan.Service{boosted}, func(out []*plan.Service) {
			checkWeights(t, out[0], boosted, 4, 1)
		})
	})
}

// testWithSignals loads a plugin built on an SDK speaking ABI version 2
// with signals, so that Weir sends it version 2 batches: the plugin must
// load, process in's first batch (its signals zero) and, once Poll has
// read signals for in, process in again with them. check checks both
// outputs.
func testWithSignals(t *testing.T, name, wasm string, in []*plan.Service, check func(out []*plan.Service)) {
	t.Helper()
	log, calls := &logRecorder{}, &callCounter{}
	chain, err := hooks.New(t.Context(), []hooks.Config{{
		Name: name, Path: wasm, Timeout: 5 * time.Second, FailurePolicy: hooks.PolicyClosed,
		Signals: []string{hooks.SignalConnections},
	}}, hooks.Options{Log: slog.New(log), Observer: calls})
	if err != nil {
		t.Fatalf("loading the plugin with signals: %v\nlog:\n%s", err, log)
	}
	t.Cleanup(func() {
		if err := chain.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	out, err := chain.Apply(t.Context(), rustNode, in, true)
	if err != nil {
		t.Fatalf("first Apply: %v\nlog:\n%s", err, log)
	}
	check(out)
	keys, err := chain.Poll(t.Context(), sameSignals{abi.Signals{Active: 7, New: 3}})
	if err != nil || len(keys) != len(in) {
		t.Fatalf("Poll: keys %v, %v; want the %d services sent", keys, err, len(in))
	}
	before := calls.ok.Load()
	out, err = chain.Apply(t.Context(), rustNode, in, false)
	if err != nil {
		t.Fatalf("Apply after the signals moved: %v\nlog:\n%s", err, log)
	}
	if calls.ok.Load() == before {
		t.Fatal("the plugin was not called again with the signals")
	}
	check(out)
	if n := calls.failed.Load(); n != 0 {
		t.Errorf("%d calls failed; log:\n%s", n, log)
	}
}

// sameSignals is a hooks.SignalSource giving every endpoint the same signals.
type sameSignals struct{ sig abi.Signals }

// Signals returns s.sig for every endpoint of every service.
func (s sameSignals) Signals(_ context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	out := make([][]abi.Signals, len(services))
	for i, svc := range services {
		out[i] = make([]abi.Signals, len(svc.Endpoints))
		for j := range out[i] {
			out[i][j] = s.sig
		}
	}
	return out, nil
}

// callCounter is a hooks.Observer counting the plugin calls that
// succeeded and those that failed.
type callCounter struct{ ok, failed atomic.Int64 }

// PluginCalled counts one call.
func (c *callCounter) PluginCalled(_ string, _ time.Duration, err error) {
	if err != nil {
		c.failed.Add(1)
	} else {
		c.ok.Add(1)
	}
}

// PluginQuarantined ignores quarantine changes.
func (c *callCounter) PluginQuarantined(string, bool) {}

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
	log.expect(t, reasons...)
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
		log.expect(t, want)
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

// buildLocalBoost compiles plugins/local-boost and the Rust SDK it uses
// with Debian's rustc into a temporary directory, as the Makefile does, and
// returns the .wasm path.
func buildLocalBoost(t *testing.T) string {
	t.Helper()
	return buildRustPlugin(t, filepath.Join("..", "plugins", "local-boost", "src", "lib.rs"))
}

// buildRustPlugin compiles the Rust SDK (sdk/rust) for wasm32-wasi, then the
// plugin crate src against it, and returns the .wasm path. It skips the test
// when the toolchain is missing, and fails it instead when CI=true.
func buildRustPlugin(t *testing.T, src string) string {
	t.Helper()
	requireRust(t)
	dir := t.TempDir()
	rlib := filepath.Join(dir, "libweir_plugin.rlib")
	runRustc(t, "--edition", "2021", "--target", "wasm32-wasi", "--crate-type", "rlib", "--crate-name", "weir_plugin",
		"-C", "opt-level=s", "-o", rlib, rustSDK)
	out := filepath.Join(dir, "plugin.wasm")
	runRustc(t, "--edition", "2021", "--target", "wasm32-wasi", "--crate-type", "cdylib", "-C", "opt-level=s", "-C", "lto",
		"-C", "strip=symbols", "-C", "linker="+debianLLD, "--extern", "weir_plugin="+rlib, "-o", out, src)
	return out
}

// runRustc runs Debian's rustc with args and fails the test if it fails.
func runRustc(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), debianRustc, args...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, msg)
	}
}

// requireRust skips the test when the Rust toolchain is missing, or fails
// it when CI=true.
func requireRust(t *testing.T) {
	t.Helper()
	if reason := rustMissing(t); reason != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(reason)
		}
		t.Skip(reason)
	}
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

// expect fails the test for every want that no log record contains. The
// host logs a plugin's stderr lines while the call runs, so they are all
// there once the call that wrote them has returned.
func (r *logRecorder) expect(t *testing.T, wants ...string) {
	t.Helper()
	if missing := r.missing(wants); len(missing) > 0 {
		t.Errorf("the log has no %q; log:\n%s", missing, r)
	}
}

// TestRustSDK runs the Rust SDK's own tests natively, built with Debian's
// rustc: they check sdk/rust against the ABI's shared vectors
// (sdk/abi/testdata/vectors), which the Go SDK's tests also check.
func TestRustSDK(t *testing.T) {
	requireRust(t)
	bin := filepath.Join(t.TempDir(), "weir-plugin-test")
	runRustc(t, "--edition", "2021", "--test", "-o", bin, rustSDK)
	vectors, err := filepath.Abs(filepath.Join("..", "sdk", "abi", "testdata", "vectors"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Env = append(os.Environ(), "WEIR_VECTORS="+vectors)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "test result: ok.") {
		t.Fatalf("%s printed no passing result:\n%s", bin, out)
	}
}

// TestRustPanicReportsLocation checks that the Rust SDK's panic hook logs
// the panic's message and the plugin's source line, and that the panic
// (a trap on wasm32-wasi) fails the batch and leaves the services alone.
func TestRustPanicReportsLocation(t *testing.T) {
	wasm := buildRustPlugin(t, filepath.Join("testdata", "guests", "rust-panic", "lib.rs"))
	chain, log := newRustChain(t, wasm)
	in := []*plan.Service{rustService("web", "node-a")}
	out, err := chain.Apply(t.Context(), rustNode, in, true)
	var pe *hooks.PluginError
	if !errors.As(err, &pe) {
		t.Fatalf("Apply: got %v, want a *hooks.PluginError", err)
	}
	t.Logf("Apply: %v", err)
	if len(out) != 1 || out[0] != in[0] {
		t.Errorf("Apply returned %v, want the input unchanged (failure policy open)", out)
	}
	// The line of the out-of-range read in testdata/guests/rust-panic/lib.rs.
	const where = "weir_process: panic at testdata/guests/rust-panic/lib.rs:14:"
	log.expect(t, where, "endpoint index 1 out of range [0,1)")
}
