//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// The weir binary, built once per test binary by weirBinary into binDir,
// which TestMain removes.
var (
	binDir    string
	buildOnce sync.Once
	weirPath  string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "weir-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// weirBinary builds cmd/weir (static) the first time a test asks for it.
func weirBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bin := filepath.Join(binDir, "weir")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/weirproxy/weir/cmd/weir")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build cmd/weir: %w\n%s", err, out)
			return
		}
		weirPath = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return weirPath
}

// weirDaemon is `weir run` running in a node namespace.
type weirDaemon struct {
	name    string
	out     *syncbuf.Buffer
	process *os.Process
	done    chan struct{} // closed once it has exited
	err     error         // what Wait returned, once done is closed
}

// startWeir runs `weir run` with the kubernetes source in node, as the
// ServiceAccount kube-system/weir (bound only by deploy/kubernetes's RBAC),
// reaching the API server through a forwarder in node. Its health and
// metrics servers listen on free loopback ports. It is killed when the
// test ends, on every path.
func startWeir(t *testing.T, cp *controlplane.ControlPlane, node *netns.Namespace, nodeName string, extra ...string) *weirDaemon {
	t.Helper()
	weirBinary(t)
	forwardAPIServer(t, cp, node)
	return runWeir(t, node, nodeName, weirArgs(t, cp, nodeName, extra...)...)
}

// weirArgs are startWeir's arguments of `weir run` for nodeName, extra
// last, with a kubeconfig of its own for Weir's ServiceAccount.
func weirArgs(t *testing.T, cp *controlplane.ControlPlane, nodeName string, extra ...string) []string {
	t.Helper()
	kubeconfig := weirKubeconfig(t, cp, nodeName)
	return append([]string{"run", "--source-kind", "kubernetes", "--kubeconfig", kubeconfig,
		"--node-name", nodeName, "--cluster-cidrs", netns.DefaultPodCIDR.String(),
		"--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"}, extra...)
}

// weirKubeconfig is a kubeconfig file of Weir's own for the ServiceAccount
// kube-system/weir, for the daemon of nodeName.
func weirKubeconfig(t *testing.T, cp *controlplane.ControlPlane, nodeName string) string {
	t.Helper()
	return ownCopy(t, cp.KubeconfigForServiceAccount(t, "kube-system", "weir"), nodeName+".kubeconfig")
}

// runWeir runs weir with args in node, without WEIR_* variables; name
// names the daemon in messages. The API server must already be
// forwarded into node (forwardAPIServer) when args use the kubernetes
// source. It is killed when the test ends, on every path.
func runWeir(t *testing.T, node *netns.Namespace, name string, args ...string) *weirDaemon {
	t.Helper()
	return runWeirBinary(t, node, name, weirBinary(t), testing.Verbose(), args...)
}

// runWeirBinary runs the weir binary bin as runWeir does; its output is
// logged at the end of the test when the test failed, or with verbose.
func runWeirBinary(t *testing.T, node *netns.Namespace, name, bin string, verbose bool, args ...string) *weirDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &weirDaemon{name: name, out: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd := node.Command(ctx, bin, args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
	cmd.Stdout, cmd.Stderr = d.out, d.out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start weir run on %s: %v", name, err)
	}
	d.process = cmd.Process
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
		if t.Failed() || verbose {
			t.Logf("weir run on %s:\n%s", name, d.out)
		}
	})
	return d
}

// stop ends the daemon as the kubelet does, with SIGTERM, and fails the
// test unless it exits cleanly within 10 s. Weir leaves its rules in
// place.
func (d *weirDaemon) stop(t *testing.T) {
	t.Helper()
	if err := d.process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to weir run on %s: %v", d.name, err)
	}
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("weir run on %s did not exit within 10s of SIGTERM:\n%s", d.name, d.out)
	}
	if d.err != nil {
		t.Fatalf("weir run on %s after SIGTERM: %v\n%s", d.name, d.err, d.out)
	}
}

// ownCopy copies the file at path into a file of its own named name, so
// that the control plane rewriting path (for the next daemon) cannot race
// with a daemon reading it.
func ownCopy(t *testing.T, path, name string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(own, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return own
}

// mustRun fails the test if the daemon has exited.
func (d *weirDaemon) mustRun(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		t.Fatalf("weir run on %s exited: %v\n%s", d.name, d.err, d.out)
	default:
	}
}

// servingLine is weir's log line of a server that listens.
var servingLine = regexp.MustCompile(`msg=Serving key=(\S+) address=(\S+)`)

// serving returns the address weir's server for key listens on.
func (d *weirDaemon) serving(t *testing.T, key string) string {
	t.Helper()
	var addr string
	poll(t, 30*time.Second, "weir on "+d.name+" to log its "+key+" server", func() bool {
		d.mustRun(t)
		for _, m := range servingLine.FindAllStringSubmatch(d.out.String(), -1) {
			if m[1] == key {
				addr = m[2]
				return true
			}
		}
		return false
	})
	return addr
}

// waitLog waits until the daemon's output contains text.
func (d *weirDaemon) waitLog(t *testing.T, text string) {
	t.Helper()
	poll(t, 30*time.Second, "weir on "+d.name+" to log "+text, func() bool {
		d.mustRun(t)
		return strings.Contains(d.out.String(), text)
	})
}

// poll calls cond every 20 ms until it holds, and fails the test if it
// does not within limit.
func poll(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forwardAPIServer listens, inside ns, on the API server's own loopback
// address and forwards each connection to the API server in the test's
// namespace, so the control plane's kubeconfigs work unchanged in ns.
// While the API server is down, connections are accepted and closed at
// once, as a dead server's would be refused.
func forwardAPIServer(t *testing.T, cp *controlplane.ControlPlane, ns *netns.Namespace) {
	t.Helper()
	u, err := url.Parse(cp.Server)
	if err != nil {
		t.Fatal(err)
	}
	f, err := netns.Forward(ns, u.Host)
	if err != nil {
		t.Fatalf("forward the API server into %s: %v", ns.Name, err)
	}
	t.Cleanup(f.Close)
}

// get fetches url with c and returns the status code and body.
func get(c *http.Client, url string) (int, string, error) {
	res, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return res.StatusCode, string(body), err
}
