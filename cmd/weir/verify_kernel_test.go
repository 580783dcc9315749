package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/netns"
)

// verifyOutput runs weir verify in ns and returns its exit code and
// standard output.
func verifyOutput(t *testing.T, ns *netns.Namespace, weir string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, weir, append([]string{"verify"}, args...)...)
	cmd.Env = weirEnv()
	var out, errOut syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee := new(exec.ExitError); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("weir verify: %v", err)
	}
	t.Logf("weir verify %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String()
}

// TestKernelVerify syncs the demo with weir sync --once in a node
// namespace and checks that weir verify finds the kernel clean, then names
// the service and the field that diverge when the plan changes without a
// sync (without touching the kernel itself) and when the table is deleted
// by hand.
func TestKernelVerify(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	args := []string{"--source-path", dir, "--node-name", demoNode}
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)

	code, out := verifyOutput(t, topo.Node, weir, args...)
	if code != 0 || !strings.Contains(out, "the kernel matches the plan") {
		t.Fatalf("weir verify after sync --once: exit %d, want 0 and a clean report", code)
	}

	// The plan loses pod-b; the kernel, never synced, still has it.
	removeEndpoint(t, filepath.Join(dir, "web.yaml"), "pod-b")
	code, out = verifyOutput(t, topo.Node, weir, args...)
	want := "default/web:http/TCP (cluster IP 10.96.0.10:80/TCP): endpoints: want 10.244.0.11:8080*1 10.244.0.13:8080*1, got 10.244.0.11:8080*"
	line := lineWith(out, want)
	if code != exitFailed || !strings.Contains(line, " 10.244.0.12:8080*") || !strings.Contains(out, "1 divergence between the plan and the kernel") {
		t.Errorf("weir verify after the plan changed: exit %d, want %d and one divergence, a line starting\n%s\nthat names 10.244.0.12:8080", code, exitFailed, want)
	}
	netns.WantPods(t, "after weir verify (which must not write)", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")

	code, out = verifyOutput(t, topo.Node, weir, append([]string{"-o", "json"}, args...)...)
	var res verifyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("weir verify -o json: %v\n%s", err, out)
	}
	if code != exitFailed || res.Mode != "nftables" || len(res.Divergences) != 1 ||
		res.Divergences[0].Service != "default/web:http/TCP" || res.Divergences[0].Field != "endpoints" {
		t.Errorf("weir verify -o json: exit %d, %+v; want exit %d and one endpoints divergence of default/web:http/TCP", code, res, exitFailed)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if b, err := topo.Node.Command(ctx, "nft", "delete", "table", "ip", "weir").CombinedOutput(); err != nil {
		t.Fatalf("nft delete table ip weir: %v\n%s", err, b)
	}
	code, out = verifyOutput(t, topo.Node, weir, args...)
	want = "default/web-nodeport:http/TCP (node port 0.0.0.0:30080/TCP): destination: want present (forward), got missing"
	if code != exitFailed || !strings.Contains(out, want) {
		t.Errorf("weir verify after nft delete table ip weir: exit %d, want %d and the line\n%s", code, exitFailed, want)
	}
}

// lineWith returns the first line of text that starts with prefix, or "".
func lineWith(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestKernelVerifyIPTables checks weir verify in mode iptables, with each
// flavour: clean after sync --once, and naming the services whose rules a
// flushed KUBE-SERVICES no longer reaches.
func TestKernelVerifyIPTables(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	for _, flavour := range []string{"nft", "legacy"} {
		t.Run(flavour, func(t *testing.T) {
			topo := netns.NewThreePods(t)
			args := []string{"--source-path", dir, "--node-name", demoNode, "--mode", "iptables", "--iptables-backend", flavour}
			runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
			if code, out := verifyOutput(t, topo.Node, weir, args...); code != 0 || !strings.Contains(out, "iptables: 2 services, 4 destinations: the kernel matches the plan") {
				t.Fatalf("weir verify after sync --once: exit %d, want 0 and a clean report", code)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if b, err := topo.Node.Command(ctx, "iptables-"+flavour, "-t", "nat", "-F", "KUBE-SERVICES").CombinedOutput(); err != nil {
				t.Fatalf("iptables-%s -t nat -F KUBE-SERVICES: %v\n%s", flavour, err, b)
			}
			code, out := verifyOutput(t, topo.Node, weir, args...)
			want := "default/web:http/TCP (cluster IP 10.96.0.10:80/TCP): destination: want present (forward), got missing"
			if code != exitFailed || !strings.Contains(out, want) {
				t.Errorf("weir verify after KUBE-SERVICES was flushed: exit %d, want %d and the line\n%s", code, exitFailed, want)
			}
		})
	}
}
