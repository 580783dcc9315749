package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/netns"
)

// writeKubeconfig writes a kubeconfig for server and returns its path.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// weir plan against an API server that refuses connections says why while
// it waits, and gives up after --timeout with the reason and exit 1.
func TestPlanTimeoutUnreachableAPIServer(t *testing.T) {
	addr := closedPort(t)
	kc := writeKubeconfig(t, "https://"+addr)
	began := time.Now()
	code, stdout, stderr := invoke(t, "plan", "--source-kind", "kubernetes", "--kubeconfig", kc,
		"--node-name", "n1", "--timeout", "2s")
	took := time.Since(began)
	if code != exitFailed || stdout != "" {
		t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitFailed)
	}
	if took > 5*time.Second {
		t.Errorf("took %v with --timeout 2s", took)
	}
	for _, want := range []string{
		`msg="Cannot reach the API server; retrying, rules unchanged"`, "attempt=1", "retryIn=",
		addr + ": connect: connection refused", "gave up after --timeout 2s", "waiting for Services",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

func TestTimeoutMustBePositive(t *testing.T) {
	for _, args := range [][]string{{"plan"}, {"sync", "--once"}} {
		args = append(args, "--source-path", "testdata/manifests", "--node-name", "n1", "--timeout", "0s")
		if code, _, stderr := invoke(t, args...); code != exitUsage || !strings.Contains(stderr, "--timeout 0s") {
			t.Errorf("weir %s: exit %d, want %d naming --timeout:\n%s", strings.Join(args, " "), code, exitUsage, stderr)
		}
	}
}

// weir plan, waiting for an API server that refuses connections, stops
// within a second of SIGTERM.
func TestPlanStopsOnSIGTERM(t *testing.T) {
	weir := buildWeir(t)
	kc := writeKubeconfig(t, "https://"+closedPort(t))
	d := startHost(t, weir, "plan", "--source-kind", "kubernetes", "--kubeconfig", kc, "--node-name", "n1")
	stopWithin(t, d, "Cannot reach the API server", time.Second)
	if !strings.Contains(d.out.String(), "terminated signal received") {
		t.Errorf("weir plan does not say why it stopped:\n%s", d.out)
	}
}

// startHost starts weir on the host, like startDaemon in a namespace.
func startHost(t *testing.T, weir string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{out: &syncbuf.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.CommandContext(ctx, weir, args...)
	d.cmd.Env = weirEnv()
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start weir %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return d
}

// stopWithin waits for the process to log want, sends it SIGTERM and fails
// unless it exits, with status 1 and the signal named, within limit.
func stopWithin(t *testing.T, d *daemon, want string, limit time.Duration) {
	t.Helper()
	d.waitLog(t, want, 30*time.Second)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err := d.wait(limit)
	if took := time.Since(began); took > limit {
		t.Fatalf("still running %v after SIGTERM:\n%s", took, d.out)
	}
	t.Logf("stopped %v after SIGTERM: %v", time.Since(began).Round(time.Millisecond), err)
}

// weir run and weir sync --once in a node namespace, waiting for an API
// server that refuses connections, stop within a second of SIGTERM.
func TestKernelStopWhileAPIServerUnreachable(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewT(t, netns.Options{})
	kc := writeKubeconfig(t, "https://127.0.0.1:6443") // nothing listens in the namespace
	common := []string{"--source-kind", "kubernetes", "--kubeconfig", kc, "--node-name", "n1",
		"--healthz-bind-address", "", "--metrics-bind-address", ""}
	for _, args := range [][]string{{"run"}, {"sync", "--once"}} {
		t.Run(args[0], func(t *testing.T) {
			d := startDaemon(t, topo.Node, weir, append(args, common...)...)
			stopWithin(t, d, "connect: connection refused", time.Second)
			if args[0] == "run" && !strings.Contains(d.out.String(), "Stopping Weir; the rules stay in place") {
				t.Errorf("weir run did not say it stopped:\n%s", d.out)
			}
		})
	}
}

// weir run whose manifest folder is removed keeps running and serving the
// rules; when the folder comes back, its changes are applied.
func TestKernelFolderRemovedKeepsRules(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	d := startDaemon(t, topo.Node, weir, "run", "--min-sync-period", "0s", "--source-path", dir,
		"--node-name", demoNode, "--healthz-bind-address", "", "--metrics-bind-address", "")
	waitAnswer(t, d, topo.Client, webVIP)

	away := dir + ".away"
	if err := os.Rename(dir, away); err != nil {
		t.Fatal(err)
	}
	d.waitLog(t, "Manifest folder is gone", 10*time.Second)
	d.mustRun(t)
	netns.WantPods(t, "with the folder gone", netns.DialMany(t, topo.Client, webVIP, 30), "pod-a", "pod-b", "pod-c")

	removeEndpoint(t, filepath.Join(away, "web.yaml"), "pod-b")
	if err := os.Rename(away, dir); err != nil {
		t.Fatal(err)
	}
	waitWithout(t, d, topo.Client, webVIP, "pod-b", 40)
}
