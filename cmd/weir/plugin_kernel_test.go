package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// buildPlugin builds one example plugin of plugins/ to a .wasm file.
func buildPlugin(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".wasm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", out, "../../plugins/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build plugin %s: %v\n%s", name, err, b)
	}
	return out
}

// canaryDemo copies the demo manifests with the web service split 90/10:
// pod-c is the canary. It returns the manifests folder, a Weir config file
// that loads the canary plugin, and the plugin's file.
func canaryDemo(t *testing.T) (dir, cfg, plugin string) {
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
	annotated := strings.Replace(string(data), meta, meta+"  annotations:\n    canary.weir.dev/split: pod-c=10\n", 1)
	if err := os.WriteFile(web, []byte(annotated), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg = filepath.Join(t.TempDir(), "weir.yaml")
	plugin = buildPlugin(t, "canary")
	yaml := "hooks:\n  cacheDir: " + filepath.Join(t.TempDir(), "cache") + "\nplugins:\n" +
		"  - name: canary\n    path: " + plugin + "\n    failurePolicy: closed\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cfg, plugin
}

// TestKernelPluginWeights runs weir with the canary plugin and counts real
// connections: the canary pod gets about 10% of them.
func TestKernelPluginWeights(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir, cfg, _ := canaryDemo(t)
	topo := netns.NewThreePods(t)
	runWeir(t, topo.Node, weir, "sync", "--once", "--config", cfg, "--source-path", dir, "--node-name", demoNode)
	const n = 1000
	got := netns.Tally(netns.DialMany(t, topo.Client, webVIP, n))
	// 10% of 1000 has a standard deviation of about 9.5: 60..140 is beyond 4σ.
	if c := got["pod-c"]; c < 60 || c > 140 {
		t.Errorf("canary pod-c answered %d of %d connections, want about 100: %v", c, n, got)
	}
	for _, pod := range []string{"pod-a", "pod-b"} {
		if c := got[pod]; c < 370 || c > 530 {
			t.Errorf("%s answered %d of %d connections, want about 450: %v", pod, c, n, got)
		}
	}
	runWeir(t, topo.Node, weir, "cleanup")
}

// TestPlanShowsPluginChanges checks that weir plan says which plugin
// changed which lines of a service.
func TestPlanShowsPluginChanges(t *testing.T) {
	dir, cfg, _ := canaryDemo(t)
	var stdout, stderr strings.Builder
	code := run([]string{"plan", "--config", cfg, "--source-path", dir, "--node-name", demoNode}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("weir plan exited %d:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"  # plugin canary changed:\n",
		"  #   - endpoint 10.244.0.13:8080 weight=1 node=weir-demo-node pod=pod-c",
		"  #   + endpoint 10.244.0.13:8080 weight=",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("weir plan output lacks %q:\n%s", want, out)
		}
	}
}

// TestPluginTestCommand runs weir plugin test on the canary demo.
func TestPluginTestCommand(t *testing.T) {
	dir, _, plugin := canaryDemo(t)
	var stdout, stderr strings.Builder
	code := run([]string{"plugin", "test", "--plugin", plugin, "--manifests", dir, "--node-name", demoNode}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("weir plugin test exited %d:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"--- default/web:http/TCP before canary\n+++ default/web:http/TCP after canary\n",
		"-  endpoint 10.244.0.13:8080 weight=1",
		"= default/web-nodeport:http/TCP unchanged\n",
		"canary changed 1 of ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("weir plugin test output lacks %q:\n%s", want, out)
		}
	}
	code = run([]string{"plugin", "test", "--manifests", dir}, &stdout, &stderr)
	if code != exitUsage {
		t.Errorf("weir plugin test without --plugin exited %d, want %d", code, exitUsage)
	}
}

// TestKernelPluginHotReload runs weir with a plugin file that changes
// nothing (affinity, for services without its annotation), then replaces
// the file with the canary plugin: weir reloads it, resyncs everything, and
// real traffic follows the 90/10 split.
func TestKernelPluginHotReload(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir, cfg, pluginPath := canaryDemo(t)
	canary, err := os.ReadFile(pluginPath)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, pluginPath, buildPlugin(t, "affinity"))
	topo := netns.NewThreePods(t)
	d := startDaemon(t, topo.Node, weir, "run", "--config", cfg, "--source-path", dir, "--node-name", demoNode,
		"--min-sync-period", "0s")
	waitAnswer(t, d, topo.Client, webVIP)
	if got := netns.Tally(netns.DialMany(t, topo.Client, webVIP, 300)); got["pod-c"] < 50 {
		t.Fatalf("before the reload pod-c answered %d of 300, want about a third: %v", got["pod-c"], got)
	}

	tmp := pluginPath + ".new"
	if err := os.WriteFile(tmp, canary, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, pluginPath); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(afterReload(d.out.String()), `msg="Synced rules" full=true`) {
		d.mustRun(t)
		if time.Now().After(deadline) {
			t.Fatalf("no full sync after the plugin file changed:\n%s", d.out)
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon's log, not synchronising with it
	}
	const n = 1000
	got := netns.Tally(netns.DialMany(t, topo.Client, webVIP, n))
	if c := got["pod-c"]; c < 60 || c > 140 {
		t.Errorf("after the reload the canary pod-c answered %d of %d connections, want about 100: %v", c, n, got)
	}
	runWeir(t, topo.Node, weir, "cleanup")
}

// afterReload returns the part of a log after "Reloaded plugin".
func afterReload(log string) string {
	_, after, _ := strings.Cut(log, `msg="Reloaded plugin"`)
	return after
}

// replaceFile copies src over dst.
func replaceFile(t *testing.T, dst, src string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
