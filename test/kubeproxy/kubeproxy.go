// Package kubeproxy runs the real kube-proxy, built by hack/controlplane
// from the same Kubernetes release as the test control plane, in a
// test/netns node namespace: the reference Weir's conformance table, its
// migration test and its side-by-side benchmark compare Weir with.
//
//	p, err := kubeproxy.Start(node, bins.KubeProxy, dir, kubeproxy.Config{
//		Mode: "nftables", NodeName: "node-a", Kubeconfig: cp.Kubeconfig,
//	})
//	defer p.Stop()
//	mark, _ := p.Scrape(ctx)
//	// ... write objects through the API ...
//	err = p.WaitSettled(ctx, mark, kubeproxy.Changes{Services: 1, Slices: 1})
//
// kube-proxy reaches the API server through whatever the kubeconfig names:
// forward a loopback API server into the node first (netns.Forward).
package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// Config is what a caller sets of kube-proxy's configuration; the rest is
// kube-proxy's default, except that it touches no conntrack sysctl.
type Config struct {
	// Mode is kube-proxy's mode: "nftables" or "iptables".
	Mode string
	// Flavour, in mode iptables, picks the iptables kube-proxy runs:
	// "nft" or "legacy" (the binaries iptables-nft or iptables-legacy
	// under the plain names, first on its PATH); empty keeps the node's
	// `iptables`.
	Flavour string
	// NodeName is the Node kube-proxy runs as (hostnameOverride).
	NodeName string
	// Kubeconfig is the path of the kubeconfig kube-proxy uses.
	Kubeconfig string
	// ClusterCIDRs are the pod ranges (clusterCIDR, detectLocalMode
	// ClusterCIDR); empty detects no pod traffic.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all cluster-IP traffic.
	MasqueradeAll bool
	// MinSyncPeriod and SyncPeriod are the mode's sync periods; zero
	// values mean 0s and one hour (no periodic sync during a test).
	MinSyncPeriod, SyncPeriod time.Duration
	// Verbosity is kube-proxy's -v; below 2 it is raised to 2, where
	// kube-proxy logs the start and end of every sync (see WaitSettled).
	Verbosity int
}

// The addresses kube-proxy serves on, inside the node namespace.
const (
	// MetricsAddress is kube-proxy's metrics server.
	MetricsAddress = "127.0.0.1:10249"
	// HealthzAddress is kube-proxy's /healthz and /livez server.
	HealthzAddress = "127.0.0.1:10256"
)

// Process is a kube-proxy running in a node namespace.
type Process struct {
	// Config is the configuration it was started with.
	Config Config
	// Started is when the process was started.
	Started time.Time

	cmd     *exec.Cmd
	cancel  context.CancelFunc
	out     *syncLog
	http    *http.Client
	done    chan struct{}
	waitErr error
}

// Start runs kube-proxy from binary in ns with cfg, writing its
// configuration file into dir. It returns once the process runs; its first
// sync comes later (WaitSettled, or WaitFirstSync).
func Start(ns *netns.Namespace, binary, dir string, cfg Config) (*Process, error) {
	if cfg.Mode != "nftables" && cfg.Mode != "iptables" {
		return nil, fmt.Errorf("kube-proxy mode %q: want nftables or iptables", cfg.Mode)
	}
	if cfg.Verbosity < 2 {
		cfg.Verbosity = 2
	}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = time.Hour
	}
	conf := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(conf, []byte(configFile(cfg)), 0o600); err != nil {
		return nil, err
	}
	env, err := environment(cfg, dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{Config: cfg, cancel: cancel, out: newSyncLog(), done: make(chan struct{}), http: ns.HTTPClient(3 * time.Second)}
	p.cmd = ns.Command(ctx, binary, "--config="+conf, fmt.Sprintf("--v=%d", cfg.Verbosity))
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A group of its own, so that Stop ends what kube-proxy started too
	// (an iptables-restore, say), as a container runtime would.
	// Pdeathsig: should the caller die without stopping it, kube-proxy
	// dies too, rather than go on programming the node.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Cancel = func() error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }
	p.cmd.WaitDelay = 5 * time.Second
	p.Started = time.Now()
	if err := p.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start kube-proxy: %w", err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// configFile is kube-proxy's KubeProxyConfiguration for cfg.
func configFile(cfg Config) string {
	cidrs := make([]string, len(cfg.ClusterCIDRs))
	for i, c := range cfg.ClusterCIDRs {
		cidrs[i] = c.String()
	}
	minSync := cfg.MinSyncPeriod
	if minSync == 0 {
		// kube-proxy's v1alpha1 defaulting turns a zero minSyncPeriod
		// into 1s (pkg/proxy/apis/config/v1alpha1/defaults.go), and with
		// --config the --iptables-min-sync-period flag is ignored; the
		// smallest non-zero period syncs at once, as 0 would.
		minSync = time.Nanosecond
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
  qps: 50
  burst: 100
hostnameOverride: %q
mode: %s
bindAddress: 0.0.0.0
healthzBindAddress: %q
metricsBindAddress: %q
clusterCIDR: %q
detectLocalMode: ClusterCIDR
# Leave the conntrack table's size and timeouts as the node has them: the
# node is a network namespace, where most of them cannot be set.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
%s:
  masqueradeAll: %t
  minSyncPeriod: %s
  syncPeriod: %s
`, cfg.Kubeconfig, cfg.NodeName, cfg.Mode, HealthzAddress, MetricsAddress, strings.Join(cidrs, ","),
		cfg.Mode, cfg.MasqueradeAll, minSync, cfg.SyncPeriod)
}

// environment is kube-proxy's environment: the caller's, with, for an
// iptables flavour, a folder first on PATH whose iptables, ip6tables and
// their -save and -restore are that flavour's.
func environment(cfg Config, dir string) ([]string, error) {
	env := os.Environ()
	if cfg.Mode != "iptables" || cfg.Flavour == "" {
		return env, nil
	}
	if cfg.Flavour != "nft" && cfg.Flavour != "legacy" {
		return nil, fmt.Errorf("iptables flavour %q: want nft or legacy", cfg.Flavour)
	}
	bin := filepath.Join(dir, "iptables-"+cfg.Flavour)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(tool + "-" + cfg.Flavour + suffix)
			if err != nil {
				return nil, fmt.Errorf("iptables flavour %s: %w", cfg.Flavour, err)
			}
			link := filepath.Join(bin, tool+suffix)
			if err := os.Symlink(target, link); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, err
			}
		}
	}
	for i, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			env[i] = "PATH=" + bin + ":" + path
			return env, nil
		}
	}
	return append(env, "PATH="+bin+":/usr/sbin:/usr/bin:/sbin:/bin"), nil
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process ended; only valid once Done is closed.
func (p *Process) Err() error { return p.waitErr }

// PID is the process id (of `ip netns exec`, which execs kube-proxy).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Log returns everything the process wrote so far.
func (p *Process) Log() string { return p.out.String() }

// Stop ends kube-proxy as the kubelet does, with SIGTERM to it and what it
// started, waits for it (killing it after 10 s), then kills whatever of its
// process group remains and waits until none does: a process left in the
// node's mount namespace would keep the namespace from being removed.
// kube-proxy leaves its rules in place. Stop returns an error when the
// process had already exited, or did not exit cleanly.
func (p *Process) Stop() error {
	defer p.cancel()
	select {
	case <-p.done:
		return fmt.Errorf("kube-proxy had already exited: %w", p.waitErr)
	default:
	}
	pgid := p.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil {
		return err
	}
	var err error
	select {
	case <-p.done:
		err = p.exitErr()
	case <-time.After(10 * time.Second):
		err = errors.New("kube-proxy did not exit within 10 s of SIGTERM")
	}
	return errors.Join(err, reapGroup(pgid))
}

// exitErr is how the process ended, nil when by SIGTERM (kube-proxy has no
// handler of its own).
func (p *Process) exitErr() error {
	var exit *exec.ExitError
	if errors.As(p.waitErr, &exit) && exit.Sys().(syscall.WaitStatus).Signaled() {
		return nil
	}
	return p.waitErr
}

// reapGroup kills every process left in group pgid and waits until the
// group is empty.
func reapGroup(pgid int) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(-pgid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if err != nil || time.Now().After(deadline) {
			return fmt.Errorf("processes of kube-proxy's group %d remain: %w", pgid, err)
		}
		time.Sleep(10 * time.Millisecond) // the kernel reaps them; nothing to wait on
	}
}

// syncLog keeps a process's output and counts the syncs kube-proxy logs
// at -v=2: "Syncing nftables rules" (or iptables) when one starts,
// "SyncProxyRules complete" when it ends, each family's proxier on its own.
type syncLog struct {
	mu       sync.Mutex
	buf      strings.Builder
	partial  string
	started  int
	finished int
}

func newSyncLog() *syncLog { return &syncLog{} }

// Write records p and counts the sync lines it completes.
func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	text := l.partial + string(p)
	lines := strings.Split(text, "\n")
	l.partial = lines[len(lines)-1]
	for _, line := range lines[:len(lines)-1] {
		switch {
		case strings.Contains(line, `"Syncing nftables rules"`), strings.Contains(line, `"Syncing iptables rules"`):
			l.started++
		case strings.Contains(line, `"SyncProxyRules complete"`):
			l.finished++
		}
	}
	return len(p), nil
}

// inFlight is the number of syncs started and not yet finished.
func (l *syncLog) inFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started - l.finished
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
