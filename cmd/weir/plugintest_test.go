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

// buildGuest builds the wasip1 plugin in the package folder pkg (relative
// to this one) into a temporary file.
func buildGuest(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg)+".wasm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build plugin %s: %v\n%s", pkg, err, b)
	}
	return out
}

// hostileDemo returns the demo manifests with the web service annotated
// for the hostile test plugin and a canary split, and the hostile plugin.
func hostileDemo(t *testing.T) (dir, hostile string) {
	t.Helper()
	dir = copyDemo(t)
	web := filepath.Join(dir, "web.yaml")
	data, err := os.ReadFile(web)
	if err != nil {
		t.Fatal(err)
	}
	const meta = "  name: web\n  namespace: default\n"
	if !strings.Contains(string(data), meta) {
		t.Fatalf("%s: no web service metadata to annotate", web)
	}
	annotated := strings.Replace(string(data), meta, meta+"  annotations:\n"+
		"    hostile.weir.dev/act: \"true\"\n    canary.weir.dev/split: pod-c=10\n", 1)
	if err := os.WriteFile(web, []byte(annotated), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, buildGuest(t, "../../hooks/testdata/guests/hostile")
}

// modeFile writes a hostile plugin config selecting mode.
func modeFile(t *testing.T, mode string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), mode+".yaml")
	if err := os.WriteFile(p, []byte("mode: "+mode+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPluginTestChain runs two plugins as a chain: the second sees the
// first one's output, and the report says which changed what.
func TestPluginTestChain(t *testing.T) {
	dir, hostile := hostileDemo(t)
	canary := buildGuest(t, "../../plugins/canary")
	code, stdout, stderr := invoke(t, "plugin", "test", "--plugin", canary, "--plugin", hostile,
		"--config", "hostile="+modeFile(t, "scribble"), "--manifests", dir, "--node-name", demoNode)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	for _, want := range []string{
		"--- default/web:http/TCP before canary, hostile\n+++ default/web:http/TCP after canary, hostile\n",
		// canary splits 9:9:2, then hostile doubles every weight.
		"+  endpoint 10.244.0.13:8080 weight=4 node=" + demoNode + " pod=pod-c",
		"  # plugin canary changed:\n",
		"  #   + endpoint 10.244.0.13:8080 weight=2 ",
		"  # plugin hostile changed:\n",
		"  #   - endpoint 10.244.0.13:8080 weight=2 ",
		// hostile acts on the whole batch, which holds both services.
		"+  endpoint 10.244.0.13:8080 weight=2 node=" + demoNode + " pod=pod-c",
		"canary, hostile changed 2 of 2 services\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "FAILED") {
		t.Errorf("output marks a failure:\n%s", stdout)
	}
}

// TestPluginTestFailures checks that every kind of plugin failure makes
// weir plugin test fail with the plugin's name and the reason, under
// either failure policy.
func TestPluginTestFailures(t *testing.T) {
	dir, hostile := hostileDemo(t)
	cache := t.TempDir() // each run then compiles the plugin once
	for _, tc := range []struct {
		name, mode string
		flags      []string
		want       []string // in the error, which names the plugin
		marked     bool     // the output has a FAILED line
	}{
		{"panic", "panic", nil, []string{"status Panic", "panic: hostile guest panics on purpose (at ",
			"guests/hostile/main.go:"}, true},
		{"panic, closed", "panic", []string{"--failure-policy", "closed"}, []string{"failurePolicy closed", "status Panic"}, true},
		{"timeout", "loop", []string{"--timeout", "20ms"}, []string{"timed out after 20ms"}, true},
		{"invalid output", "invent", nil, []string{"invalid output"}, true},
		{"memory limit", "membomb", []string{"--memory-limit", "8Mi"}, []string{"failed on"}, true},
		{"not loaded, open", "no-such-mode", nil, []string{"BadConfig", `unknown mode \"no-such-mode\"`, "not loaded"}, true},
		{"not loaded, closed", "no-such-mode", []string{"--failure-policy", "closed"}, []string{"BadConfig"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"plugin", "test", "--plugin", hostile, "--config", modeFile(t, tc.mode),
				"--manifests", dir, "--node-name", demoNode, "--cache-dir", cache}, tc.flags...)
			code, stdout, stderr := invoke(t, args...)
			if code != exitFailed {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitFailed, stdout, stderr)
			}
			msg := lastLine(stderr)
			for _, want := range append(tc.want, `weir plugin: `, `plugin "hostile"`) {
				if !strings.Contains(msg, strings.ReplaceAll(want, `\"`, `"`)) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			if got := strings.Contains(stdout, "! FAILED plugin hostile: "); got != tc.marked {
				t.Errorf("output marks the failure: %v, want %v:\n%s", got, tc.marked, stdout)
			}
		})
	}
}

// lastLine returns the last line of s, where a direct command's error goes.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestPluginTestGolden writes a golden file with --update, passes against
// it, and fails naming each difference once it is edited.
func TestPluginTestGolden(t *testing.T) {
	dir := copyDemo(t)
	drain := buildGuest(t, "../../plugins/drain")
	cfg := filepath.Join(t.TempDir(), "drain.yaml")
	if err := os.WriteFile(cfg, []byte("nodes: [other-node]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gold := filepath.Join(t.TempDir(), "drain.golden")
	args := []string{"plugin", "test", "--plugin", drain, "--config", cfg, "--manifests", dir, "--node-name", demoNode,
		"--expect", gold, "--cache-dir", t.TempDir()}
	if code, _, stderr := invoke(t, args...); code != exitFailed || !strings.Contains(stderr, "--update") {
		t.Fatalf("without the golden file: exit %d, want %d and a hint at --update:\n%s", code, exitFailed, stderr)
	}
	if code, stdout, stderr := invoke(t, append(args, "--update")...); code != 0 || !strings.Contains(stdout, "wrote "+gold) {
		t.Fatalf("--update: exit %d:\n%s\n%s", code, stdout, stderr)
	}
	if code, _, stderr := invoke(t, args...); code != 0 {
		t.Fatalf("against its own golden file: exit %d:\n%s", code, stderr)
	}
	data, err := os.ReadFile(gold)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(data), "weight=1 node="+demoNode+" pod=pod-b", "weight=5 node="+demoNode+" pod=pod-b", 1)
	edited += "\n# a comment\nservice default/gone:http/TCP\n  clusterIP 10.96.0.99 port 80\n"
	edited = strings.Replace(edited, "service default/web-nodeport:http/TCP", "service default/web-nodeport:web/TCP", 1)
	if err := os.WriteFile(gold, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := invoke(t, args...)
	if code != exitFailed {
		t.Fatalf("against an edited golden file: exit %d, want %d", code, exitFailed)
	}
	for _, want := range []string{
		"the result differs from " + gold,
		"service default/web:http/TCP: differs:\n  - endpoint 10.244.0.12:8080 weight=5 ",
		"\n  + endpoint 10.244.0.12:8080 weight=1 ",
		"service default/gone:http/TCP: expected, but missing from the result",
		"service default/web-nodeport:web/TCP: expected, but missing from the result",
		"service default/web-nodeport:http/TCP: in the result, not expected",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("error lacks %q:\n%s", want, stderr)
		}
	}
}

// TestPluginTestUsage checks the flag errors, which need no plugin built.
func TestPluginTestUsage(t *testing.T) {
	base := []string{"plugin", "test", "--manifests", "testdata/manifests"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "needs --plugin"},
		{[]string{"--plugin", "a.wasm", "--update"}, "give --expect FILE"},
		{[]string{"--plugin", "a.wasm", "--failure-policy", "sometimes"}, `--failure-policy "sometimes"`},
		{[]string{"--plugin", "a.wasm", "--memory-limit", "lots"}, `--memory-limit "lots"`},
		{[]string{"--plugin", "a.wasm", "--memory-limit", "1Ki"}, "--memory-limit"},
		{[]string{"--plugin", "a.wasm", "--timeout", "1h"}, "--timeout"},
		{[]string{"--plugin", "a.wasm", "--plugin", "b.wasm", "--config", "c.yaml"}, "use NAME=FILE where NAME is one of a, b"},
		{[]string{"--plugin", "a.wasm", "--plugin", "x/a.wasm"}, "--plugin NAME="},
	} {
		code, _, stderr := invoke(t, append(base, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
	if code, _, stderr := invoke(t, "plugin", "frobnicate"); code != exitUsage || !strings.Contains(stderr, "plugin new") {
		t.Errorf("unknown subcommand: exit %d, stderr %q", code, stderr)
	}
}

// TestPlanMarksPluginFailure checks that weir plan marks a failed plugin
// in its output, still prints the plan, and fails.
func TestPlanMarksPluginFailure(t *testing.T) {
	dir, hostile := hostileDemo(t)
	for _, tc := range []struct{ name, mode, want string }{
		{"call", "panic", "status Panic"},
		{"load", "no-such-mode", "not loaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "weir.yaml")
			yaml := "plugins:\n  - name: hostile\n    path: " + hostile + "\n    failurePolicy: open\n" +
				"    config: {mode: " + tc.mode + "}\n"
			if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := invoke(t, "plan", "--config", cfg, "--source-path", dir, "--node-name", demoNode)
			if code != exitFailed {
				t.Fatalf("exit %d, want %d:\n%s", code, exitFailed, stderr)
			}
			if !strings.Contains(stdout, "service default/web:http/TCP\n") {
				t.Errorf("no plan printed:\n%s", stdout)
			}
			if !strings.Contains(stdout, "! FAILED plugin hostile: ") || !strings.Contains(stdout, tc.want) {
				t.Errorf("output does not mark the failure (%q):\n%s", tc.want, stdout)
			}
		})
	}
}

// TestPluginTestSignals runs least-conn with a --signals file: the loaded
// endpoint is weighted down, as weir run would after reading the signals;
// a malformed file is refused with its name.
func TestPluginTestSignals(t *testing.T) {
	dir := copyDemo(t)
	plugin := buildGuest(t, "../../plugins/least-conn")
	signals := filepath.Join(t.TempDir(), "signals.yaml")
	if err := os.WriteFile(signals, []byte("10.244.0.11:8080: {active: 12, new: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := invoke(t, "plugin", "test", "--plugin", plugin, "--manifests", dir, "--node-name", demoNode,
		"--signals", signals)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	if want := "+  endpoint 10.244.0.11:8080 weight=8 "; !strings.Contains(stdout, want) {
		t.Errorf("output lacks %q:\n%s", want, stdout)
	}
	code, stdout, _ = invoke(t, "plugin", "test", "--plugin", plugin, "--manifests", dir, "--node-name", demoNode)
	if code != 0 || strings.Contains(stdout, "weight=8") {
		t.Errorf("without --signals: exit %d, output\n%s\nwant no change", code, stdout)
	}

	if err := os.WriteFile(signals, []byte("pod-a: {active: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = invoke(t, "plugin", "test", "--plugin", plugin, "--manifests", dir, "--node-name", demoNode,
		"--signals", signals)
	if code == 0 || !strings.Contains(stderr, signals+`: "pod-a" is not ADDRESS:PORT`) {
		t.Errorf("malformed --signals: exit %d, stderr\n%s", code, stderr)
	}
}
