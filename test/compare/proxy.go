package compare

import (
	"context"
	"net/netip"
	"time"

	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
	"github.com/weirproxy/weir/test/weirrun"
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
	w, err := weirrun.Start(node, bins.Weir, weirArgs(t, s)...)
	if err != nil {
		return nil, time.Time{}, err
	}
	return w, w.Started, nil
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
