package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirproxy/weir/internal/golden"
)

// invoke runs the command in-process and returns its exit code and output.
func invoke(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVersion(t *testing.T) {
	code, stdout, stderr := invoke(t, "version")
	if code != 0 || stdout != "weir "+version+"\n" || stderr != "" {
		t.Errorf("weir version: exit %d, stdout %q, stderr %q; want 0, %q, nothing", code, stdout, stderr, "weir "+version+"\n")
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		// want are substrings stderr must hold.
		want []string
	}{
		{"no arguments", nil, []string{"Usage: weir <command>", "run", "sync", "plan", "cleanup", "version"}},
		{"help", []string{"help"}, []string{"Usage: weir <command>"}},
		{"unknown command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`, "Usage: weir <command>"}},
		{"sync without --once", []string{"sync", "--source-path", "testdata/manifests", "--node-name", "n1"},
			[]string{"--once", "weir run"}},
		{"bad mode", []string{"run", "--mode", "nope"}, []string{"mode", `"nope"`, "nftables", "iptables", "ipvs"}},
		{"bad mode for plan", []string{"plan", "--mode", "nope", "--source-path", "testdata/manifests"},
			[]string{"mode", `"nope"`, "nftables"}},
		{"unknown flag", []string{"plan", "--no-such-flag"}, []string{"no-such-flag"}},
		{"stray argument", []string{"plan", "--source-path", "testdata/manifests", "extra"}, []string{`"extra"`}},
		{"bad duration", []string{"run", "--min-sync-period", "soon"}, []string{"soon"}},
		{"diagnose without a target", []string{"diagnose", "--source-path", "testdata/manifests"}, []string{"NAMESPACE/NAME[:PORT]", "--all", "node"}},
		{"diagnose without a namespace", []string{"diagnose", "web", "--source-path", "testdata/manifests"}, []string{`web\": want NAMESPACE/NAME`}},
		{"diagnose with an empty port", []string{"diagnose", "default/web:", "--source-path", "testdata/manifests"}, []string{`default/web:\": want NAMESPACE/NAME`}},
		{"diagnose --all with a service", []string{"diagnose", "--all", "default/web", "--source-path", "testdata/manifests"}, []string{"--all takes no service"}},
		{"diagnose two services", []string{"diagnose", "default/a", "default/b", "--source-path", "testdata/manifests"}, []string{"want one of"}},
		{"trace without --from", []string{"diagnose", "trace", "--to", "10.96.0.10:80", "--source-path", "testdata/manifests"}, []string{"trace needs --from ADDR"}},
		{"trace with a bad protocol", []string{"diagnose", "trace", "--from", "10.0.0.1", "--to", "10.96.0.10:80/ICMP", "--source-path", "testdata/manifests"},
			[]string{"use TCP, UDP or SCTP"}},
		{"--from without trace", []string{"diagnose", "default/web", "--from", "10.0.0.1", "--source-path", "testdata/manifests"}, []string{"--from and --to go with trace"}},
		{"diagnose bad output", []string{"diagnose", "-o", "yaml", "default/web", "--source-path", "testdata/manifests"}, []string{"--output", "yaml", "use text or json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := invoke(t, tt.args...)
			if code != exitUsage {
				t.Errorf("weir %s: exit %d, want %d\nstderr:\n%s", strings.Join(tt.args, " "), code, exitUsage, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestUnknownEnvironmentVariable(t *testing.T) {
	t.Setenv("WEIR_MODDE", "nftables")
	code, _, stderr := invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1")
	if code != exitUsage {
		t.Errorf("exit %d, want %d\nstderr:\n%s", code, exitUsage, stderr)
	}
	if !strings.Contains(stderr, "WEIR_MODDE") {
		t.Errorf("stderr does not name the variable:\n%s", stderr)
	}
}

func TestEnvironmentSetsMode(t *testing.T) {
	t.Setenv("WEIR_MODE", "nope")
	code, _, stderr := invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1")
	if code != exitUsage || !strings.Contains(stderr, "WEIR_MODE") || !strings.Contains(stderr, `"nope"`) {
		t.Errorf("exit %d, want %d and an error naming WEIR_MODE and its value:\n%s", code, exitUsage, stderr)
	}
}

func TestPlanGolden(t *testing.T) {
	code, stdout, stderr := invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1")
	if code != 0 {
		t.Fatalf("weir plan: exit %d\nstderr:\n%s", code, stderr)
	}
	golden.Compare(t, filepath.Join("testdata", "plan.golden"), stdout)
	for _, bad := range []string{"WARN", "ERROR"} {
		if strings.Contains(stderr, "level="+bad) {
			t.Errorf("weir plan logged a %s on clean input:\n%s", bad, stderr)
		}
	}
}

func TestPlanSkipsBadInput(t *testing.T) {
	dir := filepath.Join("testdata", "bad-input")
	code, stdout, stderr := invoke(t, "plan", "--source-path", dir, "--node-name", "n1")
	if code != 0 {
		t.Fatalf("weir plan: exit %d, want 0 (bad input is skipped)\nstderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "service default/good:http/TCP\n") {
		t.Errorf("the good service is missing from the plan:\n%s", stdout)
	}
	if strings.Contains(stdout, "default/bad") || strings.Contains(stdout, "broken") {
		t.Errorf("the plan holds a bad service:\n%s", stdout)
	}
	lines := strings.Split(stderr, "\n")
	find := func(parts ...string) bool {
		for _, l := range lines {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(l, p)
			}
			if all {
				return true
			}
		}
		return false
	}
	if !find("level=WARN", `msg="Skipping manifest"`, "file="+filepath.Join(dir, "services.yaml"), "document=2") {
		t.Errorf("no warning naming the malformed document (services.yaml, document 2):\n%s", stderr)
	}
	if !find("level=WARN", `msg="Skipping invalid input"`, `object="Service default/bad"`, "field=spec.clusterIP", "10.96.0.300") {
		t.Errorf("no warning naming Service default/bad, its clusterIP field and value:\n%s", stderr)
	}
}

func TestPlanMissingSourcePath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nowhere")
	code, stdout, stderr := invoke(t, "plan", "--source-path", missing, "--node-name", "n1")
	if code != exitFailed {
		t.Errorf("exit %d, want %d", code, exitFailed)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing", stdout)
	}
	if !strings.Contains(stderr, "Failed to execute plan") || !strings.Contains(stderr, missing) {
		t.Errorf("stderr does not report the failure and the path:\n%s", stderr)
	}
}

func TestPlanJSONLog(t *testing.T) {
	code, _, stderr := invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1", "--log-format", "json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(l, "{") {
			t.Errorf("not a JSON log line: %q", l)
		}
	}
}
