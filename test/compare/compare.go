// Package compare runs kube-proxy and Weir side by side against one real
// control plane and measures both the same way: `make bench-compare`
// (hack/compare) and a short run in `make e2e`.
//
// Services and EndpointSlices of test/scale's mix are written through the
// API (there is no kubelet and no EndpointSlice controller work: the
// slices are written directly, as a load generator). Each proxy then runs
// in turn, in its own fresh node network namespace against the same API
// server, with the same settings, and is measured:
//
//   - start → first sync: from the process's start until a connection from
//     a client namespace to a probe service's cluster IP is answered by its
//     pod, through the proxy's rules;
//   - full sync: the proxy's own kubeproxy_sync_full_proxy_rules_duration_seconds
//     for that sync (both serve kube-proxy's metrics);
//   - one change: a probe service's endpoint moved to another pod through
//     the API, from the write until the new pod answers, one at a time;
//   - churn: EndpointSlice updates at a steady rate, half of them probed,
//     API write to kernel;
//   - peak (VmHWM) and steady (VmRSS after the churn) RSS and CPU time
//     (utime+stime of the process and its children) from /proc;
//   - the kernel objects it left (nft -j, iptables-legacy-save), counted
//     after it stopped.
//
// Every run is capped; one that passes the cap is killed and reported as
// "> cap", and the comparison goes on.
package compare

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// Report is everything a comparison measured.
type Report struct {
	// Results are the runs, in the order they ran.
	Results []Result
	// Loads are the loading of each size through the API.
	Loads []Load
	// IPVS says why mode ipvs did not run, or is empty.
	IPVS string
}

// Load is the writing of one size's objects through the API.
type Load struct {
	Size Size
	// Writes are the API writes (Services, their labels and load-balancer
	// statuses, EndpointSlices) and Took their wall time.
	Writes int
	Took   time.Duration
	// Created, Hidden and Shown count the Services created, hidden from
	// the proxies and shown again; Rewritten the slices given another
	// endpoint count.
	Created, Hidden, Shown, Rewritten int
}

// runner holds what the runs share.
type runner struct {
	cfg        Config
	w          *writer
	probes     *probeSet
	apiHost    string
	kubeconfig string
	logf       func(format string, args ...any)
	runs       int

	// size is the load the proxies see now, cluster what is in the API,
	// stride the churn's step through the services; mu guards the
	// churn's versions.
	size    Size
	cluster cluster
	stride  int
	mu      sync.Mutex
}

// Run compares the configured proxies on cp, which it fills with the
// load; it returns what it measured, also when ctx ends early.
func Run(ctx context.Context, cp *controlplane.ControlPlane, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, err := newRunner(ctx, cp, cfg)
	if err != nil {
		return nil, err
	}
	rep := &Report{IPVS: ipvsMissing()}
	for _, size := range cfg.orderedSizes() {
		load, err := r.load(ctx, size)
		rep.Loads = append(rep.Loads, load)
		if err != nil {
			return rep, err
		}
		for _, minSync := range cfg.settings(size) {
			for _, mode := range cfg.Modes {
				for _, t := range cfg.targets(mode) {
					res := r.runOrSkip(ctx, rep, t, size, minSync)
					rep.Results = append(rep.Results, res)
					if ctx.Err() != nil {
						return rep, context.Cause(ctx)
					}
				}
			}
		}
	}
	return rep, nil
}

// newRunner makes the API client, the namespaces, the Node and the probe
// services.
func newRunner(ctx context.Context, cp *controlplane.ControlPlane, cfg Config) (*runner, error) {
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = 5000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.WarningHandler = rest.NoWarnings{}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cp.Server)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, w: &writer{client: client, workers: cfg.Writers}, apiHost: u.Host,
		kubeconfig: cp.Kubeconfig, logf: logger(cfg)}
	if err := createNamespaces(ctx, client); err != nil {
		return nil, err
	}
	if err := createNode(ctx, client, netns.DefaultClientSubnet.Addr().Next()); err != nil {
		return nil, err
	}
	if r.probes, err = newProbeSet(ctx, r.w, cfg.ProbeServices); err != nil {
		return nil, err
	}
	return r, nil
}

// logger writes progress lines to cfg.Log, if set.
func logger(cfg Config) func(string, ...any) {
	return func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%s compare: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		}
	}
}

// load makes the API hold size, creating only the services it lacks.
func (r *runner) load(ctx context.Context, size Size) (Load, error) {
	l := Load{Size: size}
	r.logf("loading %s: services and their slices through the API", size)
	var ch loadChanges
	begin := time.Now()
	err := r.w.resize(ctx, &r.cluster, size, &ch)
	l.Took = time.Since(begin)
	l.Writes, l.Created, l.Hidden = int(ch.writes.Load()), int(ch.created.Load()), int(ch.hidden.Load())
	l.Shown, l.Rewritten = int(ch.shown.Load()), int(ch.rewritten.Load())
	if err != nil {
		return l, err
	}
	r.size, r.stride = size, stride(size.Services)
	r.logf("%d writes in %v (%.0f/s): %d services created, %d hidden, %d shown, %d slices rewritten",
		l.Writes, l.Took.Round(time.Millisecond), float64(l.Writes)/l.Took.Seconds(), l.Created, l.Hidden, l.Shown, l.Rewritten)
	return l, nil
}

// runOrSkip runs t at size and minSync, unless a reason not to is known.
func (r *runner) runOrSkip(ctx context.Context, rep *Report, t Target, size Size, minSync time.Duration) Result {
	res := Result{Target: t, Size: size, MinSync: minSync}
	if t.Mode == "ipvs" && rep.IPVS != "" {
		res.Skipped = rep.IPVS
		return res
	}
	if prev := cappedBefore(rep.Results, t, size); prev != nil {
		res.Skipped = fmt.Sprintf("its first sync passed the cap at %s (minSyncPeriod %v)", prev.Size.label(), prev.MinSync)
		res.Capped = "first sync"
		return res
	}
	r.runs++
	res.Dir = filepath.Join(r.cfg.Dir, fmt.Sprintf("%02d-%s-%s-%s-min%v", r.runs, size, t.Proxy, t.Mode, minSync))
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		res.Failed = err.Error()
		return res
	}
	r.logf("%s at %s, minSyncPeriod %v (logs in %s)", t, size, minSync, res.Dir)
	capped, cancel := context.WithTimeout(ctx, r.cfg.Cap)
	defer cancel()
	begin := time.Now()
	err := r.measure(capped, ctx, &res)
	res.Took = time.Since(begin)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		res.Failed = "interrupted: " + context.Cause(ctx).Error()
	case errors.Is(err, context.DeadlineExceeded) && capped.Err() != nil:
		res.Capped = res.phase
	default:
		res.Failed = fmt.Sprintf("%s: %v", res.phase, err)
	}
	r.logf("%s", res.summary())
	return res
}

// cappedBefore returns an earlier result of t whose first sync passed the
// cap at a size no larger than size (no more services, no more
// endpoints): its first sync would pass it again.
func cappedBefore(results []Result, t Target, size Size) *Result {
	for i := range results {
		p := &results[i]
		if p.Target == t && p.Capped == "first sync" && p.Skipped == "" &&
			p.Size.Services <= size.Services && p.Size.total() <= size.total() {
			return p
		}
	}
	return nil
}

// ipvsMissing says why this host cannot run mode ipvs, or "" when it can.
func ipvsMissing() string {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		return ""
	}
	return "this kernel has no IPVS (/proc/net/ip_vs is missing); mode ipvs runs where the host has the ip_vs modules"
}

// summary is one line on a finished run, for the progress log.
func (r *Result) summary() string {
	switch {
	case r.Failed != "":
		return fmt.Sprintf("%s at %s failed after %v: %s", r.Target, r.Size, r.Took.Round(time.Second), r.Failed)
	case r.Capped != "":
		return fmt.Sprintf("%s at %s passed the cap in phase %q", r.Target, r.Size, r.Capped)
	}
	return fmt.Sprintf("%s at %s: first sync %v, full sync %v, change median %v, churn p99 %v (%d probed), RSS %d MiB, in %v",
		r.Target, r.Size, r.FirstSync.Round(time.Millisecond), r.FullSync.Round(time.Millisecond),
		quantile(r.Changes, 0.5).Round(100*time.Microsecond), quantile(r.Churn, 0.99).Round(100*time.Microsecond),
		len(r.Churn), r.SteadyRSS>>20, r.Took.Round(time.Second))
}

// quantile is the q-quantile of ds (nearest rank), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
