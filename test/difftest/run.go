package difftest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
	"github.com/weirproxy/weir/test/weirrun"
)

// Modes are the modes a differential run can take: kube-proxy's and
// Weir's nftables and iptables modes (iptables with the nft flavour, what
// kube-proxy's image picks on a fresh node).
var Modes = []string{"nftables", "iptables"}

// Config is what a differential run needs.
type Config struct {
	// Weir is the weir binary; KubeProxy is kube-proxy's, built with the
	// control plane (hack/controlplane).
	Weir, KubeProxy string
	// Dir receives each run's proxy log, in a folder per seed and mode.
	Dir string
	// Parallel is how many probes run at once; zero means 12.
	Parallel int
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// The runs of a seed in one mode, in the order they are made: kube-proxy,
// Weir, then kube-proxy again for the noise floor.
const (
	runKubeProxy = "kube-proxy"
	runWeir      = "weir"
	runAgain     = "kube-proxy again"
)

// firstSyncWait bounds a proxy's start and first sync.
const firstSyncWait = 2 * time.Minute

// RunSeed writes the scenario of seed through cp's API, serves it in each
// mode by kube-proxy, Weir and kube-proxy again, each in a fresh topology,
// compares the probes' outcomes and removes the objects. It returns a
// Result per mode; an error means the comparison could not be made.
func RunSeed(ctx context.Context, cp *controlplane.ControlPlane, cfg Config, seed int64, modes []string) ([]*Result, error) {
	sc := Generate(seed)
	probes := Probes(sc)
	u, err := url.Parse(cp.Server)
	if err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = 200, 400
	rc.WarningHandler = rest.NoWarnings{} // externalIPs are deprecated, and used on purpose
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if err := write(ctx, client, sc); err != nil {
		return nil, errors.Join(fmt.Errorf("seed %d: %w", seed, err), clearAll(context.WithoutCancel(ctx), client))
	}
	var out []*Result
	for _, mode := range modes {
		h := &harness{cfg: cfg, seed: seed, mode: mode, apiHost: u.Host, kubeconfig: cp.Kubeconfig}
		res, err := h.compare(ctx, sc, probes)
		if err != nil {
			err = fmt.Errorf("seed %d, mode %s: %w", seed, mode, err)
			return out, errors.Join(err, clearAll(context.WithoutCancel(ctx), client))
		}
		out = append(out, res)
	}
	return out, clearAll(ctx, client)
}

// harness runs the proxies of one seed and mode.
type harness struct {
	cfg        Config
	seed       int64
	mode       string
	apiHost    string
	kubeconfig string
}

func (h *harness) logf(format string, args ...any) {
	if h.cfg.Logf != nil {
		h.cfg.Logf("seed %d %s: "+format, append([]any{h.seed, h.mode}, args...)...)
	}
}

// compare serves the scenario three times and compares the outcomes.
func (h *harness) compare(ctx context.Context, sc *Scenario, probes []Probe) (*Result, error) {
	runs := map[string]map[string]Outcome{}
	for _, run := range []string{runKubeProxy, runWeir, runAgain} {
		begin := time.Now()
		outs, err := h.serve(ctx, run, probes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", run, err)
		}
		runs[run] = outs
		h.logf("%s: %d probes in %v", run, len(probes), time.Since(begin).Round(time.Millisecond))
	}
	return judge(sc, h.mode, probes, runs), nil
}

// proxy is kube-proxy's or Weir's running process.
type proxy interface {
	kubeproxy.Proxy
	WaitFirstSync(ctx context.Context) error
	Stop() error
	Log() string
}

// serve runs one proxy in a fresh topology, waits for its first sync and
// runs every probe.
func (h *harness) serve(ctx context.Context, run string, probes []Probe) (outs map[string]Outcome, err error) {
	topo, err := netns.New(netns.Options{Pods: podSpecs()})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	fwd, err := netns.Forward(topo.Node, h.apiHost)
	if err != nil {
		return nil, fmt.Errorf("forward the API server into the node: %w", err)
	}
	defer fwd.Close()
	dir := filepath.Join(h.cfg.Dir, fmt.Sprintf("seed-%d-%s", h.seed, h.mode), run)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := h.start(run, topo, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		err = errors.Join(err, p.Stop())
		if werr := os.WriteFile(filepath.Join(dir, "proxy.log"), []byte(p.Log()), 0o644); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, firstSyncWait)
	defer cancel()
	if err := p.WaitFirstSync(wctx); err != nil {
		return nil, fmt.Errorf("%w (log in %s)", err, dir)
	}
	outs = h.probeAll(ctx, topo, probes)
	select {
	case <-p.Done():
		return nil, fmt.Errorf("the proxy exited while probed (log in %s): %w", dir, p.Err())
	default:
	}
	return outs, ctx.Err()
}

// start runs kube-proxy or Weir in the topology's node with the same
// configuration: this node, the pod range as cluster CIDR, syncs at once
// and no periodic one, the mode's defaults otherwise.
func (h *harness) start(run string, topo *netns.Topology, dir string) (proxy, error) {
	if run != runWeir {
		cfg := kubeproxy.Config{Mode: h.mode, NodeName: NodeName, Kubeconfig: h.kubeconfig,
			ClusterCIDRs: []netip.Prefix{podsRange}}
		if h.mode == "iptables" {
			cfg.Flavour = "nft"
		}
		return kubeproxy.Start(topo.Node, h.cfg.KubeProxy, dir, cfg)
	}
	args := []string{"run", "--source-kind", "kubernetes", "--kubeconfig", h.kubeconfig,
		"--node-name", NodeName, "--cluster-cidrs", podsRange.String(),
		"--min-sync-period", "0s", "--sync-period", "1h",
		"--metrics-bind-address", kubeproxy.MetricsAddress, "--healthz-bind-address", kubeproxy.HealthzAddress,
		"--mode", h.mode}
	if h.mode == "iptables" {
		args = append(args, "--iptables-backend", "nft")
	}
	return weirrun.Start(topo.Node, h.cfg.Weir, args...)
}

// probeAll runs the probes, Parallel at a time, and returns their outcomes
// by ID.
func (h *harness) probeAll(ctx context.Context, topo *netns.Topology, probes []Probe) map[string]Outcome {
	pr := &prober{topo: topo, http: map[*netns.Namespace]*http.Client{}}
	n := h.cfg.Parallel
	if n <= 0 {
		n = 12
	}
	work := make(chan Probe)
	var mu sync.Mutex
	outs := make(map[string]Outcome, len(probes))
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for p := range work {
				o := pr.run(ctx, p)
				mu.Lock()
				outs[p.ID] = o
				mu.Unlock()
			}
		})
	}
	for _, p := range probes {
		work <- p
	}
	close(work)
	wg.Wait()
	return outs
}
