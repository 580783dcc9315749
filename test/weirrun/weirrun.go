// Package weirrun runs `weir run` as a process of its own in a test/netns
// node namespace, the way harnesses that put Weir beside the real
// kube-proxy (test/compare, test/difftest) need it: its output kept, its
// kube-proxy metrics read as test/kubeproxy reads kube-proxy's, stopped
// with SIGTERM as the kubelet stops it.
package weirrun

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// Process is `weir run` in a node namespace.
type Process struct {
	// Started is when the process was started.
	Started time.Time

	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	http *http.Client
	done chan struct{}
	err  error
}

// Start runs the weir binary with args in node, without the caller's
// WEIR_* variables; it dies with the calling thread (Pdeathsig). Its
// metrics are expected on kubeproxy.MetricsAddress inside node.
func Start(node *netns.Namespace, bin string, args ...string) (*Process, error) {
	w := &Process{out: &syncbuf.Buffer{}, http: node.HTTPClient(3 * time.Second), done: make(chan struct{})}
	w.cmd = node.Command(context.Background(), bin, args...)
	w.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
	w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
	// A group of its own, as kube-proxy gets one (kubeproxy.Start), so
	// that Stop ends what it started too.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	w.Started = time.Now()
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start weir run: %w", err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	return w, nil
}

// PID is the process id (`ip netns exec` execs Weir in place).
func (w *Process) PID() int { return w.cmd.Process.Pid }

// Scrape reads the sync metrics Weir serves under kube-proxy's names.
func (w *Process) Scrape(ctx context.Context) (kubeproxy.Snapshot, error) {
	return kubeproxy.ScrapeURL(ctx, w.http, "http://"+kubeproxy.MetricsAddress+"/metrics")
}

// Done is closed once the process has exited; Err then says how.
func (w *Process) Done() <-chan struct{} { return w.done }

// Err is how the process ended; only valid once Done is closed.
func (w *Process) Err() error { return w.err }

// Log returns everything the process wrote so far.
func (w *Process) Log() string { return w.out.String() }

// WaitFirstSync waits until Weir has committed its first sync of every
// family and settled (kubeproxy.WaitFirstSync).
func (w *Process) WaitFirstSync(ctx context.Context) error {
	return kubeproxy.WaitFirstSync(ctx, w)
}

// Stop sends SIGTERM to Weir's process group and waits for Weir's exit,
// killing the group after 10 s, and then whatever of it remains; Weir
// leaves its rules in place, as kube-proxy does.
func (w *Process) Stop() error {
	select {
	case <-w.done:
		return fmt.Errorf("weir had already exited: %w", orNone(w.err))
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

// orNone is err, or one saying the exit was clean.
func orNone(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
