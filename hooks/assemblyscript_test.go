package hooks_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// The AssemblyScript SDK's directory and its compiler, installed there by
// npm ci; paths are relative to the repository's root.
const (
	asSDK      = "sdk/assemblyscript"
	asCompiler = asSDK + "/node_modules/.bin/asc"
	// asAbort replaces AssemblyScript's env.abort import with the SDK's
	// abort, which logs the location through WASI and traps.
	asAbort = "abort=" + asSDK + "/assembly/index/abort"
)

// sameZoneAnnotation is the annotation plugins/as-same-zone reads.
const sameZoneAnnotation = "same-zone.weir.dev/only"

// TestAssemblyScriptSDK runs the AssemblyScript SDK's tests
// (sdk/assemblyscript/test): they check it against the ABI's shared vectors.
func TestAssemblyScriptSDK(t *testing.T) {
	requireAssemblyScript(t)
	out := filepath.Join(t.TempDir(), "vectors.wasm")
	runFromRoot(t, asCompiler, "sdk/assemblyscript/test/vectors.ts", "--outFile", out, "--runtime", "incremental",
		"--optimizeLevel", "1", "--use", asAbort)
	cmd := exec.CommandContext(t.Context(), "node", filepath.Join("..", asSDK, "test", "run.mjs"))
	cmd.Env = append(os.Environ(), "WEIR_AS_TEST_WASM="+out)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, msg)
	}
	t.Logf("%s", msg)
}

// TestAssemblyScriptSameZone runs plugins/as-same-zone, written in
// AssemblyScript with its SDK, through the real host.
func TestAssemblyScriptSameZone(t *testing.T) {
	requireAssemblyScript(t)
	wasm := filepath.Join(t.TempDir(), "as-same-zone.wasm")
	runFromRoot(t, asCompiler, "plugins/as-same-zone/index.ts", "--outFile", wasm, "--runtime", "incremental",
		"--optimizeLevel", "3", "--shrinkLevel", "1", "--use", asAbort)
	log := &logRecorder{}
	chain, err := hooks.New(t.Context(), []hooks.Config{{Name: "as-same-zone", Path: wasm, Timeout: 5 * time.Second}},
		hooks.Options{Log: slog.New(log)})
	if err != nil {
		t.Fatalf("loading the AssemblyScript plugin: %v\nlog:\n%s", err, log)
	}
	t.Cleanup(func() {
		if err := chain.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	// Several batches on one instance: the SDK's heap must serve them all.
	for round := range 3 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) { testSameZone(t, chain, log, round) })
	}
	t.Run("Signals", func(t *testing.T) {
		mixed := zonedService("signals", "true", "zone-2", "zone-1", "zone-3", "zone-1")
		testWithSignals(t, "as-same-zone", wasm, []*plan.Service{mixed}, func(out []*plan.Service) {
			want := []plan.Endpoint{mixed.Endpoints[1], mixed.Endpoints[3]}
			if !slices.Equal(out[0].Endpoints, want) || !sameButEndpoints(out[0], mixed) {
				t.Errorf("%s: got %v, want only its zone-1 endpoints %v", mixed.Key, out[0], want)
			}
		})
	})
}

// testSameZone sends one batch and checks which services lost endpoints.
func testSameZone(t *testing.T, chain *hooks.Chain, log *logRecorder, round int) {
	name := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }
	mixed := zonedService(name("mixed"), "true", "zone-1", "zone-2", "zone-1", "zone-3")
	elsewhere := zonedService(name("elsewhere"), "true", "zone-2", "zone-3")
	plain := zonedService(name("plain"), "", "zone-1", "zone-2")
	other := zonedService(name("other"), "yes", "zone-1", "zone-2")
	in := []*plan.Service{mixed, elsewhere, plain, other}
	out, err := chain.Apply(t.Context(), rustNode, in, round == 0)
	if err != nil {
		t.Fatalf("Apply: %v\nlog:\n%s", err, log)
	}
	want := []plan.Endpoint{mixed.Endpoints[0], mixed.Endpoints[2]}
	if out[0] == mixed || !slices.Equal(out[0].Endpoints, want) || !sameButEndpoints(out[0], mixed) {
		t.Errorf("%s: got %v, want only its zone-1 endpoints %v", mixed.Key, out[0], want)
	}
	for i, s := range in[1:] {
		if out[1+i] != s {
			t.Errorf("%s: got a new service %v, want the input itself", s.Key, out[1+i])
		}
	}
}

// zonedService returns default/name:http/TCP with one endpoint in each of
// the zones, annotated with sameZoneAnnotation unless only is "".
func zonedService(name, only string, zones ...string) *plan.Service {
	eps := make([]plan.Endpoint, len(zones))
	for i, zone := range zones {
		eps[i] = sdktest.Endpoint(fmt.Sprintf("10.2.0.%d", i+1), 8080, "node-"+zone, zone, fmt.Sprintf("%s-%d", name, i))
	}
	s := sdktest.Service("default", name, "10.0.0.2", 80, eps...)
	s.Key.Port = "http"
	if only != "" {
		s.Annotations = map[string]string{sameZoneAnnotation: only}
	}
	return s
}

// requireAssemblyScript skips the test when node or the AssemblyScript
// compiler (cd sdk/assemblyscript && npm ci) is missing.
func requireAssemblyScript(t *testing.T) {
	t.Helper()
	reason := ""
	if _, err := exec.LookPath("node"); err != nil {
		reason = "node is missing: install Node.js 20 or later, then run make as-plugins (npm ci in " + asSDK + ")"
	} else if _, err := os.Stat(filepath.Join("..", asCompiler)); err != nil {
		reason = "the AssemblyScript compiler is missing: run make as-plugins (npm ci in " + asSDK + ")"
	}
	switch {
	case reason == "":
	case os.Getenv("CI") == "true":
		t.Fatal(reason + " (a skip is a failure under CI=true)")
	default:
		t.Skip(reason)
	}
}

// runFromRoot runs a command from the repository's root (the compiler
// names files by their paths from there, which --use abort relies on).
func runFromRoot(t *testing.T, name string, args ...string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, name), args...)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(msg), "ERROR") {
		t.Fatalf("%s: %v\n%s", cmd, err, msg)
	}
}
