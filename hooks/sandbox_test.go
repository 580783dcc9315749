package hooks

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

const (
	actAnnotation    = "hostile.weir.dev/act"
	weightAnnotation = "reweight.weir.dev/weight"
)

// sandboxCases are plugins that misbehave on batches holding a service
// annotated actAnnotation, and what the failure says.
var sandboxCases = []struct{ guest, mode, reason string }{
	{"hostile", "loop", "weir_process: timed out after 250ms"},
	{"hostile", "membomb", "weir_process: wasm error: unreachable (stderr: runtime: out of memory"},
	{"hostile", "panic", "weir_process returned status Panic (stderr: panic: hostile guest panics on purpose (at "},
	{"hostile", "garbage", "invalid output: batch header"},
	{"hostile", "invent", "invalid output: service 0 (default/alpha:/TCP): endpoint 0"},
	{"hostile", "addservice", "invalid output: batch header"},
	{"hostile", "vip", "invalid output: service 0 (default/alpha:/TCP)"},
	{"hostile", "fail", "status Failed (stderr: refusing the batch on purpose)"},
	{"raw", "oversize", "more than the limit of"},
	{"raw", "badptr", "outside its memory"},
	{"raw", "nooutput", "weir_process returned neither an output nor a failure status"},
	{"raw", "trap", "weir_process: wasm error: unreachable (stderr: panic: runtime error: invalid memory address"},
}

// TestSandbox shows that a misbehaving plugin fails only its batch, under
// either policy: Apply goes on, the result holds only endpoints it was
// given, the failure is logged with the plugin's name and a fresh instance
// serves the next call.
func TestSandbox(t *testing.T) {
	for _, tc := range sandboxCases {
		for _, policy := range []Policy{PolicyOpen, PolicyClosed} {
			t.Run(tc.mode+"/"+string(policy), func(t *testing.T) {
				t.Parallel()
				testSandbox(t, tc.guest, tc.mode, tc.reason, policy)
			})
		}
	}
}

func testSandbox(t *testing.T, guestName, mode, reason string, policy Policy) {
	timeout := 2 * time.Second // generous: parallel tests under -race share two cores
	if mode == "loop" {
		timeout = 250 * time.Millisecond
	}
	c, logs := newChain(t, Options{},
		Config{Name: "bad", Path: guest(guestName), Config: map[string]any{"mode": mode},
			FailurePolicy: policy, Timeout: timeout, MemoryLimit: 16 << 20},
		Config{Name: "reweight", Path: guest("reweight")})
	alpha := svc("default", "alpha", 3, weightAnnotation, "7")
	beta := svc("default", "beta", 2)
	good, err := apply(c, []*plan.Service{alpha, beta}, true)
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}

	in := []*plan.Service{with(alpha, actAnnotation, "true"), beta}
	start := time.Now()
	out, err := apply(c, in, true)
	elapsed := time.Since(start)
	var pe *PluginError
	if !errors.As(err, &pe) {
		t.Fatalf("Apply returned %v, want a *PluginError", err)
	}
	if pe.Plugin != "bad" || pe.Policy != policy || pe.Services != 1 || !strings.Contains(err.Error(), reason) {
		t.Errorf("Apply returned %v (plugin %q, policy %s, %d services), want plugin bad, policy %s, 1 service, %q",
			err, pe.Plugin, pe.Policy, pe.Services, policy, reason)
	}
	if mode == "loop" && elapsed > 2*timeout {
		t.Errorf("Apply took %s with a looping plugin; the timeout is %s", elapsed, timeout)
	}
	assertSubset(t, in, out)
	if out[1] != good[1] {
		t.Errorf("beta was not served from the cache")
	}
	switch policy {
	case PolicyOpen: // alpha passed the bad plugin unchanged and reached reweight
		if out[0] == nil || out[0].Annotations[actAnnotation] != "true" || !slices.Equal(weights(out[0]), []uint32{7, 7, 7}) {
			t.Errorf("open policy: alpha is %+v, want the input reweighted to 7", out[0])
		}
	case PolicyClosed: // alpha kept its last good output
		if out[0] != good[0] {
			t.Errorf("closed policy: alpha is %+v, want its last good output %+v", out[0], good[0])
		}
	}
	if len(logs.lines("Plugin failed", "plugin=bad")) == 0 {
		t.Errorf("no log line names the failed plugin")
	}

	calls, _ := stats(c, "bad")
	next := []*plan.Service{with(alpha, "round", "3"), beta}
	out, err = apply(c, next, true)
	if err != nil {
		t.Fatalf("Apply after the failure: %v", err)
	}
	if after, _ := stats(c, "bad"); after != calls+1 {
		t.Errorf("the plugin got %d calls after the failure, want 1", after-calls)
	}
	if !slices.Equal(weights(out[0]), []uint32{7, 7, 7}) {
		t.Errorf("after the failure alpha's weights are %v, want 7s", weights(out[0]))
	}
}

// TestSandboxNoFiles shows that a plugin cannot read the host's files: the
// attempt fails inside the sandbox and nothing of the file shows up.
func TestSandboxNoFiles(t *testing.T) {
	c, logs := newChain(t, Options{}, Config{Name: "reader", Path: guest("hostile"),
		Config: map[string]any{"mode": "readfile"}, FailurePolicy: PolicyClosed})
	in := []*plan.Service{svc("default", "alpha", 2, actAnnotation, "true")}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if out[0] != in[0] {
		t.Errorf("the plugin changed the service: %+v", out[0])
	}
	if len(logs.lines("Plugin output", "plugin=reader", "stream=stderr", "readfile failed: open /etc/passwd")) != 1 {
		t.Errorf("the failed read was not logged")
	}
	if strings.Contains(logs.String(), "root:") {
		t.Errorf("the plugin read /etc/passwd")
	}
}

// TestOutputCapped shows the limits on what a plugin may write to the log:
// 4 KiB per call, 512 bytes per line, one note when cut.
func TestOutputCapped(t *testing.T) {
	c, logs := newChain(t, Options{}, Config{Name: "chatty", Path: guest("hostile"),
		Config: map[string]any{"mode": "chatty"}})
	if _, err := apply(c, []*plan.Service{svc("default", "alpha", 1, actAnnotation, "true")}, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	lines := logs.lines("Plugin output", "plugin=chatty")
	if len(lines) < 10 {
		t.Fatalf("logged %d lines of output, want the first ones", len(lines))
	}
	total := 0
	for _, l := range lines {
		_, text, _ := strings.Cut(l, "line=")
		total += len(text)
		if len(text) > outputPerLine+2 { // +2 for the quotes
			t.Errorf("logged a line of %d bytes", len(text))
		}
	}
	if total > outputPerCall+3*len(lines) {
		t.Errorf("logged %d bytes of output", total)
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "chatty line 299") }) {
		t.Errorf("the last line was logged though the budget was spent")
	}
	if n := len(logs.lines("Plugin output truncated", "plugin=chatty")); n != 1 {
		t.Errorf("logged %d truncation notes, want 1", n)
	}
}
