package main

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// buildHostile builds the hostile test guest of the hooks package.
func buildHostile(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hostile.wasm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", out, "../../hooks/testdata/guests/hostile")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the hostile guest: %v\n%s", err, b)
	}
	return out
}

// hostileConfig writes a Weir config loading the hostile guest in mode,
// with failurePolicy closed, and returns its path.
func hostileConfig(t *testing.T, plugin, mode string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	yaml := "plugins:\n  - name: hostile\n    path: " + plugin + "\n    failurePolicy: closed\n" +
		"    config: {mode: " + mode + "}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestKernelClosedPluginFailureKeepsRulesAcrossRestarts: rules are in the
// kernel when weir sync --once starts with a closed plugin that fails on
// the web service. It used to commit the service without rules ("Synced
// rules full=true services=0", exit 0); now the kernel's rules for it are
// kept and the command exits 1, in every mode this kernel has.
func TestKernelClosedPluginFailureKeepsRulesAcrossRestarts(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	plugin := buildHostile(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			dir := copyDemo(t)
			annotate(t, filepath.Join(dir, "web.yaml"), "hostile.weir.dev/act", `"true"`)
			topo := netns.NewThreePods(t)
			args := []string{"sync", "--once", "--mode", mode, "--source-path", dir, "--node-name", demoNode}
			runWeir(t, topo.Node, weir, append(args, "--config", hostileConfig(t, plugin, "report"))...)
			netns.WantPods(t, "after a sync with a working plugin", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")

			out, err := weirOutput(topo.Node, weir, append(args, "--config", hostileConfig(t, plugin, "fail"))...)
			if code := exitCode(err); code != exitFailed {
				t.Errorf("sync --once with a failing closed plugin: exit %d (%v), want %d\n%s", code, err, exitFailed, out)
			}
			if !strings.Contains(out, "hook plugins failed") {
				t.Errorf("sync --once did not report the plugin failure:\n%s", out)
			}
			netns.WantPods(t, "after a restart with the plugin failing", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")
			runWeir(t, topo.Node, weir, "cleanup")
		})
	}
}

// TestKernelConflictingServicesDoNotBlockOthers: two services claim one
// node port and one cluster IP and port, both with endpoints. Every commit
// used to fail ("file exists") and no service synced; now the older keeps
// the destinations, the newer keeps the rest, and the others sync.
func TestKernelConflictingServicesDoNotBlockOthers(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			dir := copyDemo(t)
			// web-nodeport (nodePort 30080) is older; the copy, created
			// later, claims its node port and web's cluster IP and port.
			writeFile(t, filepath.Join(dir, "conflict.yaml"), conflictManifest)
			topo := netns.NewThreePods(t)
			out, err := weirOutput(topo.Node, weir, "sync", "--once", "--mode", mode, "--source-path", dir, "--node-name", demoNode)
			if err != nil {
				t.Fatalf("sync --once with conflicting services: %v\n%s", err, out)
			}
			for _, want := range []string{"Skipping conflicting destination", "default/web-nodeport", "default/web:http/TCP"} {
				if !strings.Contains(out, want) {
					t.Errorf("the log does not name %q:\n%s", want, out)
				}
			}
			netns.WantPods(t, "web, the older claimant", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")
			netns.WantPods(t, "the newer service's own cluster IP", netns.DialMany(t, topo.Client, conflictVIP, 20), "pod-a")
			runWeir(t, topo.Node, weir, "cleanup")
		})
	}
}

var conflictVIP = netip.MustParseAddrPort("10.96.0.99:8080")

const conflictManifest = `apiVersion: v1
kind: Service
metadata:
  name: zz-copy
  namespace: default
  creationTimestamp: "2030-01-01T00:00:00Z"
spec:
  type: NodePort
  clusterIP: 10.96.0.99
  externalIPs: [10.96.0.10]
  ports:
    - name: http
      protocol: TCP
      port: 80
      targetPort: 8080
      nodePort: 30080
    - name: own
      protocol: TCP
      port: 8080
      targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: zz-copy-1
  namespace: default
  labels:
    kubernetes.io/service-name: zz-copy
addressType: IPv4
ports:
  - name: http
    port: 8080
    protocol: TCP
  - name: own
    port: 8080
    protocol: TCP
endpoints:
  - addresses: ["10.244.0.11"]
    conditions: {ready: true}
    nodeName: weir-demo-node
`

// annotate adds an annotation to the first object of a manifest file.
func annotate(t *testing.T, path, key, value string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(data), "metadata:\n")
	if i < 0 {
		t.Fatalf("%s: no metadata", path)
	}
	i += len("metadata:\n")
	out := string(data[:i]) + "  annotations:\n    " + key + ": " + value + "\n" + string(data[i:])
	writeFile(t, path, out)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// weirOutput runs weir to completion in ns and returns its output and error.
func weirOutput(ns *netns.Namespace, weir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, weir, args...)
	cmd.Env = weirEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// exitCode is the exit status err reports; 0 for nil, -1 if not an exit.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e := new(exec.ExitError); errors.As(err, &e) {
		return e.ExitCode()
	}
	return -1
}
