package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/netns"
)

// The demo's cluster is netns.ThreePods on node demoNode:
// examples/demo/*.yaml describe those pods.
const demoNode = "weir-demo-node"

// webVIP is the demo's web service.
var webVIP = netip.MustParseAddrPort("10.96.0.10:80")

// TestKernelDemo runs the weir binary against the demo manifests in a node
// namespace and sends real connections to the ClusterIP from a client.
func TestKernelDemo(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	sourceArgs := []string{"--source-path", dir, "--node-name", demoNode}

	// sync --once programs the rules and exits.
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, sourceArgs...)...)
	netns.WantPods(t, "after weir sync --once", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")

	// cleanup removes them.
	runWeir(t, topo.Node, weir, "cleanup")
	if a, err := dialOnce(topo.Client, webVIP); err == nil {
		t.Fatalf("after weir cleanup the ClusterIP still answers: %s", a)
	}

	// run keeps them in sync with the folder.
	d := startDaemon(t, topo.Node, weir, append([]string{"run", "--min-sync-period", "0s"}, sourceArgs...)...)
	waitAnswer(t, d, topo.Client, webVIP)
	// Like kube-proxy, it set conntrack's timeouts (the namespace's own);
	// nf_conntrack_max, the host's, it cannot set from here, and says so.
	var established []byte
	if err := topo.Node.Do(func() (err error) {
		established, err = os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
		return err
	}); err != nil || strings.TrimSpace(string(established)) != "86400" {
		t.Errorf("nf_conntrack_tcp_timeout_established = %q, %v; want conntrack.tcpEstablishedTimeout's 24h, 86400", established, err)
	}
	if !strings.Contains(d.out.String(), "Cannot set a connection-tracking parameter") || !strings.Contains(d.out.String(), "nf_conntrack_max") {
		t.Errorf("weir run did not warn that it cannot set nf_conntrack_max in a network namespace:\n%s", d.out)
	}
	removeEndpoint(t, filepath.Join(dir, "web.yaml"), "pod-b")
	waitWithout(t, d, topo.Client, webVIP, "pod-b", 40)
	if want := `msg="Updating endpoints" service=default/web:http/TCP endpoints=2`; !strings.Contains(d.out.String(), want) {
		t.Errorf("weir run did not log the partial sync %s:\n%s", want, d.out)
	}

	// SIGTERM stops it cleanly and leaves the rules serving.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if err := d.wait(10 * time.Second); err != nil {
		t.Fatalf("weir run after SIGTERM: %v, want exit 0\n%s", err, d.out)
	}
	if !strings.Contains(d.out.String(), "Stopping Weir") {
		t.Errorf("weir run did not log its shutdown:\n%s", d.out)
	}
	netns.WantPods(t, "after weir run stopped", netns.DialMany(t, topo.Client, webVIP, 30), "pod-a", "pod-c")

	runWeir(t, topo.Node, weir, "cleanup")
	if a, err := dialOnce(topo.Client, webVIP); err == nil {
		t.Errorf("after the final weir cleanup the ClusterIP still answers: %s", a)
	}
}

// buildWeir builds the command into a temporary directory.
func buildWeir(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "weir")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// copyDemo copies examples/demo/*.yaml into a temporary directory.
func copyDemo(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "demo", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("demo manifests: %v (found %d)", err, len(files))
	}
	dir := t.TempDir()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runWeir runs weir to completion in ns and fails unless it exits 0.
func runWeir(t *testing.T, ns *netns.Namespace, weir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, weir, args...)
	cmd.Env = weirEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("weir %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("weir %s:\n%s", strings.Join(args, " "), out)
}

// weirEnv is the test's environment without WEIR_* variables, which would
// change what the command does.
func weirEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
}

// daemon is a weir process running in the background.
type daemon struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{} // closed when it has exited
	err  error         // what Wait returned, once done is closed
}

// startDaemon starts weir in ns. It is killed when the test ends, on
// every path, unless it has exited by then.
func startDaemon(t *testing.T, ns *netns.Namespace, weir string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// `ip netns exec` execs weir in place, so the process is weir itself
	// and signals reach it directly.
	cmd := ns.Command(ctx, weir, args...)
	cmd.Env = weirEnv()
	return superviseDaemon(t, cmd, cancel, cmd.Start, args)
}

// superviseDaemon starts cmd with start, collects its output and kills it
// (through cancel, cmd's context) when the test ends, unless it has exited
// by then.
func superviseDaemon(t *testing.T, cmd *exec.Cmd, cancel context.CancelFunc, start func() error, args []string) *daemon {
	t.Helper()
	d := &daemon{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	d.cmd.WaitDelay = 5 * time.Second
	if err := start(); err != nil {
		cancel()
		t.Fatalf("start weir %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel() // kills it if it still runs
		<-d.done
		t.Logf("weir %s output:\n%s", strings.Join(args, " "), d.out)
	})
	return d
}

// wait waits up to timeout for the daemon to exit and returns how it ended.
func (d *daemon) wait(timeout time.Duration) error {
	select {
	case <-d.done:
		return d.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %s", timeout)
	}
}

// waitLog polls the daemon's output until it holds want, failing the test
// if the daemon exits or within passes first.
func (d *daemon) waitLog(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(d.out.String(), want) {
		d.mustRun(t)
		if time.Now().After(deadline) {
			t.Fatalf("no %q in weir's log within %v:\n%s", want, within, d.out)
		}
		time.Sleep(10 * time.Millisecond) // polling the log, not synchronising with it
	}
}

// mustRun fails the test if the daemon is no longer running.
func (d *daemon) mustRun(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		t.Fatalf("weir run exited early: %v\n%s", d.err, d.out)
	default:
	}
}

// dialOnce makes one connection with a short deadline.
func dialOnce(ns *netns.Namespace, addr netip.AddrPort) (netns.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return ns.DialTCP(ctx, addr)
}

// waitAnswer polls until addr answers.
func waitAnswer(t *testing.T, d *daemon, ns *netns.Namespace, addr netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		d.mustRun(t)
		if _, err = dialOnce(ns, addr); err == nil {
			return
		}
	}
	t.Fatalf("%s did not answer within 10s: %v", addr, err)
}

// waitWithout polls until n consecutive connections to addr succeed
// without reaching pod.
func waitWithout(t *testing.T, d *daemon, ns *netns.Namespace, addr netip.AddrPort, pod string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	run := 0
	var last string
	for time.Now().Before(deadline) {
		d.mustRun(t)
		a, err := dialOnce(ns, addr)
		switch {
		case err != nil:
			run, last = 0, err.Error()
		case a.Pod == pod:
			run, last = 0, a.String()
		default:
			if run++; run == n {
				return
			}
		}
	}
	t.Fatalf("%s still reached %s (or failed) within the last %d connections after 10s; last: %s", addr, pod, n, last)
}

// removeEndpoint rewrites the manifest file without the endpoints whose
// target is pod, through a temporary hidden file and a rename, as an editor
// or a ConfigMap update would.
func removeEndpoint(t *testing.T, path, pod string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	found := false
	for i, doc := range docs {
		if !strings.Contains(doc, "kind: EndpointSlice") {
			continue
		}
		var s discoveryv1.EndpointSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("%s: document %d: %v", path, i+1, err)
		}
		n := len(s.Endpoints)
		s.Endpoints = slices.DeleteFunc(s.Endpoints, func(e discoveryv1.Endpoint) bool {
			return e.TargetRef != nil && e.TargetRef.Name == pod
		})
		if len(s.Endpoints) == n {
			continue
		}
		out, err := yaml.Marshal(&s)
		if err != nil {
			t.Fatal(err)
		}
		docs[i], found = string(out), true
	}
	if !found {
		t.Fatalf("%s: no EndpointSlice with an endpoint for %s", path, pod)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(errors.Join(err, os.Remove(tmp)))
	}
}

// TestKernelDemoIPTables runs the demo through mode iptables with each
// flavour: weir sync --once serves the ClusterIP, the chains are where a
// kube-proxy runbook looks for them, and weir cleanup, in its default mode,
// removes them.
func TestKernelDemoIPTables(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	for _, flavour := range []string{"nft", "legacy"} {
		t.Run(flavour, func(t *testing.T) {
			topo := netns.NewThreePods(t)
			args := []string{"--source-path", dir, "--node-name", demoNode, "--mode", "iptables", "--iptables-backend", flavour}
			runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
			netns.WantPods(t, "after weir sync --once", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := topo.Node.Command(ctx, "iptables-"+flavour, "-t", "nat", "-L", "KUBE-SERVICES", "-n").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "KUBE-SVC-") || !strings.Contains(string(out), "default/web:http cluster IP") {
				t.Errorf("iptables-%s -t nat -L KUBE-SERVICES -n: %v\n%s", flavour, err, out)
			}
			// cleanup in the default mode (nftables) removes every mode's rules.
			runWeir(t, topo.Node, weir, "cleanup")
			if a, err := dialOnce(topo.Client, webVIP); err == nil {
				t.Errorf("after weir cleanup the ClusterIP still answers: %s", a)
			}
			if out, err := topo.Node.Command(ctx, "iptables-"+flavour, "-t", "nat", "-L", "KUBE-SERVICES", "-n").CombinedOutput(); err == nil {
				t.Errorf("after weir cleanup KUBE-SERVICES still exists:\n%s", out)
			}
		})
	}
}
