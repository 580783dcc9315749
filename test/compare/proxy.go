package compare

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
)

// proxy is a running kube-proxy or Weir, seen the same way: its process,
// its kube-proxy metrics and its output.
type proxy interface {
	// PID is the proxy's process (`ip netns exec` execs it in place).
	PID() int
	// Scrape reads the sync metrics both proxies serve.
	Scrape(ctx context.Context) (kubeproxy.Snapshot, error)
	// Done is closed once the process has exited; Err then says how.
	Done() <-chan struct{}
	Err() error
	// Stop ends it with SIGTERM, as the kubelet does.
	Stop() error
	// Log is everything it wrote.
	Log() string
}

// settings are what both proxies are started with.
type settings struct {
	kubeconfig                string
	minSyncPeriod, syncPeriod time.Duration
}

// startProxy runs target in node with s, its files in dir, and returns it
// with the time its process was started.
func startProxy(t Target, bins Config, node *netns.Namespace, dir string, s settings) (proxy, time.Time, error) {
	if t.Proxy == KubeProxy {
		p, err := kubeproxy.Start(node, bins.KubeProxy, dir, kubeproxy.Config{
			Mode: t.kernelMode(), Flavour: t.flavour(), NodeName: nodeName, Kubeconfig: s.kubeconfig,
			ClusterCIDRs:  []netip.Prefix{netns.DefaultPodCIDR},
			MinSyncPeriod: s.minSyncPeriod, SyncPeriod: s.syncPeriod,
		})
		if err != nil {
			return nil, time.Time{}, err
		}
		return p, p.Started, nil
	}
	return startWeir(node, bins.Weir, weirArgs(t, s))
}

// weirArgs are the `weir run` arguments equal to kube-proxy's
// configuration in kubeproxy.Start: same node, kubeconfig, cluster CIDR,
// sync periods and server addresses.
func weirArgs(t Target, s settings) []string {
	args := []string{"run", "--source-kind", "kubernetes", "--kubeconfig", s.kubeconfig,
		"--node-name", nodeName, "--cluster-cidrs", netns.DefaultPodCIDR.String(),
		"--min-sync-period", s.minSyncPeriod.String(), "--sync-period", s.syncPeriod.String(),
		"--metrics-bind-address", kubeproxy.MetricsAddress, "--healthz-bind-address", kubeproxy.HealthzAddress,
		"--mode", t.kernelMode()}
	if f := t.flavour(); f != "" {
		args = append(args, "--iptables-backend", f)
	}
	return args
}

// weirProcess is `weir run` in a node namespace.
type weirProcess struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	http *http.Client
	done chan struct{}
	err  error
}

// startWeir runs the weir binary with args in node, without WEIR_*
// variables; it dies with this process's thread (Pdeathsig).
func startWeir(node *netns.Namespace, bin string, args []string) (*weirProcess, time.Time, error) {
	w := &weirProcess{out: &syncbuf.Buffer{}, http: node.HTTPClient(3 * time.Second), done: make(chan struct{})}
	w.cmd = node.Command(context.Background(), bin, args...)
	w.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
	w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
	// A group of its own, as kube-proxy gets one (kubeproxy.Start), so
	// that Stop ends what it started too.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := time.Now()
	if err := w.cmd.Start(); err != nil {
		return nil, started, fmt.Errorf("start weir run: %w", err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	return w, started, nil
}

func (w *weirProcess) PID() int { return w.cmd.Process.Pid }

func (w *weirProcess) Scrape(ctx context.Context) (kubeproxy.Snapshot, error) {
	return kubeproxy.ScrapeURL(ctx, w.http, "http://"+kubeproxy.MetricsAddress+"/metrics")
}

func (w *weirProcess) Done() <-chan struct{} { return w.done }

func (w *weirProcess) Err() error { return w.err }

func (w *weirProcess) Log() string { return w.out.String() }

// Stop sends SIGTERM to Weir's process group and waits for Weir's exit,
// killing the group after 10 s, and then whatever of it remains; Weir
// leaves its rules in place, as kube-proxy does.
func (w *weirProcess) Stop() error {
	select {
	case <-w.done:
		return fmt.Errorf("weir had already exited: %w", orNone(w.err, "exit status 0"))
	default:
	}
	pgid := w.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil {
		return err
	}
	var err error
	select {
	case <-w.done:
		err = w.err
	case <-time.After(10 * time.Second):
		err = errors.New("weir did not exit within 10 s of SIGTERM")
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // ESRCH: nothing of the group is left
	<-w.done
	return err
}
