package compare

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
)

// Result is what one run (one target at one size and minSyncPeriod)
// measured. A zero duration or size is a measure not taken: see Skipped,
// Capped and Failed.
type Result struct {
	Target  Target
	Size    Size
	MinSync time.Duration

	// Skipped says why the run did not happen.
	Skipped string
	// Capped names the phase the run was in when it passed the cap.
	Capped string
	// Failed says why the run broke off.
	Failed string

	// FirstSync is from the process's start to the first probe answered
	// through its rules; FullSync the proxy's own figure for that sync.
	FirstSync, FullSync time.Duration
	// Changes are the one-endpoint changes, API write to kernel.
	Changes []time.Duration
	// Churn are the probed changes of the churn phase, API write to
	// kernel; ChurnWrites counts every write of the phase, ChurnBusy the
	// writes that moved a load endpoint because every probe service had
	// maxPending writes being measured, and ChurnLate the writes left out
	// because maxOutstanding were still waiting for the API server.
	Churn                             []time.Duration
	ChurnWrites, ChurnBusy, ChurnLate int
	// ChurnRate and ChurnFor are the rate asked for and how long the
	// churn wrote.
	ChurnRate float64
	ChurnFor  time.Duration
	// PeakRSS (VmHWM) and SteadyRSS (VmRSS once the churn settled) are the
	// proxy process's, ChildPeakRSS the largest peak seen in one of its
	// child processes (nft, iptables-restore), in bytes.
	PeakRSS, SteadyRSS, ChildPeakRSS int64
	// CPUFirst is the CPU time used up to the first sync, CPUChurn during
	// the churn phase, CPUTotal over the whole run (with children).
	CPUFirst, CPUChurn, CPUTotal time.Duration
	// Kernel is what the proxy left in the kernel (nil when not counted,
	// then KernelErr may say why).
	Kernel    *Counts
	KernelErr string
	// Notes are remarks on the run (a failed stop, a log warning).
	Notes []string
	// Took is the run's wall time, Dir its logs.
	Took time.Duration
	Dir  string

	phase string
}

// Missing lists the measures of a run that completed but lack a figure;
// a harness check, not a judgement of the figures.
func (r *Result) Missing() []string {
	var out []string
	check := func(ok bool, name string) {
		if !ok {
			out = append(out, name)
		}
	}
	check(r.FirstSync > 0, "first sync")
	check(r.FullSync > 0, "full sync")
	check(len(r.Changes) > 0, "one change")
	check(len(r.Churn) > 0, "churn latency")
	check(r.PeakRSS > 0 && r.SteadyRSS > 0, "RSS")
	check(r.CPUTotal > 0, "CPU")
	check(r.Kernel != nil && r.Kernel.Rules > 0, "kernel objects")
	return out
}

// node is one run's fresh node namespace, with a client namespace, the
// probe pods, the sink and the API server forwarded into it.
type node struct {
	topo   *netns.Topology
	fwd    *netns.Forwarder
	http   *http.Client
	budget *dialBudget
}

// serviceRange is the control plane's IPv4 service range.
var serviceRange = strings.Split(controlplane.ServiceCIDRs, ",")[0]

// sinkIP is the address of the sink pod, which takes the node's traffic
// to cluster IPs no rule has rewritten.
var sinkIP = offset(netns.DefaultPodCIDR.Addr(), 100)

// newNode builds a node for one run. A probe to a cluster IP the proxy
// has not programmed yet must fail at once rather than time out: the node
// routes the service range to a "sink" pod that holds the whole range as
// local addresses and answers every connection with a reset. (An
// unreachable route would do, but the kernel limits route-error ICMPs to
// a burst of five, then one a second, host-wide.)
func newNode(ctx context.Context, apiHost string) (n *node, err error) {
	topo, err := netns.New(netns.Options{})
	if err != nil {
		return nil, fmt.Errorf("node namespace: %w", err)
	}
	n = &node{topo: topo, http: topo.Node.HTTPClient(3 * time.Second), budget: newDialBudget()}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.close())
		}
	}()
	for j := range probePodCount {
		if _, err := topo.AddPod(netns.PodSpec{Name: probePodName(j), IP: probePodIP(j), Ports: []uint16{podPort}}); err != nil {
			return n, err
		}
	}
	sink, err := topo.AddPod(netns.PodSpec{Name: "sink", IP: sinkIP})
	if err != nil {
		return n, err
	}
	for _, c := range []*exec.Cmd{
		topo.Node.Command(ctx, "ip", "route", "add", serviceRange, "via", sinkIP.String()),
		sink.NS.Command(ctx, "ip", "route", "add", "local", serviceRange, "dev", "lo"),
	} {
		if out, err := c.CombinedOutput(); err != nil {
			return n, fmt.Errorf("sink for %s: %s: %w: %s", serviceRange, c.Args, err, out)
		}
	}
	if n.fwd, err = netns.Forward(topo.Node, apiHost); err != nil {
		return n, fmt.Errorf("forward the API server into the node: %w", err)
	}
	return n, nil
}

// close removes the node's namespaces, and with them every rule a proxy
// wrote there.
func (n *node) close() error {
	n.budget.close()
	if n.fwd != nil {
		n.fwd.Close()
	}
	return n.topo.Close()
}

// measure runs res.Target at res.Size in a fresh node and takes every
// measure; ctx carries the cap, parent does not (the kernel objects are
// counted after the proxy stopped, outside the cap).
func (r *runner) measure(ctx, parent context.Context, res *Result) error {
	res.phase = "setup"
	n, err := newNode(ctx, r.apiHost)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := n.close(); cerr != nil {
			res.Notes = append(res.Notes, "removing the node: "+cerr.Error())
		}
	}()
	p, started, err := startProxy(res.Target, r.cfg, n.topo.Node, res.Dir, settings{
		kubeconfig: r.kubeconfig, minSyncPeriod: res.MinSync, syncPeriod: r.cfg.SyncPeriod,
	})
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			atCap(res, p.PID())
			_ = p.Stop() // broke off: how it ends is no figure
		}
		if werr := os.WriteFile(filepath.Join(res.Dir, "proxy.log"), []byte(p.Log()), 0o644); werr != nil {
			res.Notes = append(res.Notes, "writing its log: "+werr.Error())
		}
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-p.Done():
			cancel(fmt.Errorf("%s exited (log in %s): %w", res.Target, res.Dir, orNone(p.Err(), "exit status 0")))
		case <-ctx.Done():
		}
	}()
	kids := sampleChildren(p.PID())
	defer kids.finish()
	if err := r.takeMeasures(ctx, res, p, n, started); err != nil {
		return err
	}
	res.ChildPeakRSS = kids.finish()
	stopped = true
	if err := p.Stop(); err != nil {
		res.Notes = append(res.Notes, "stopping it: "+err.Error())
	}
	res.phase = "kernel objects"
	cctx, ccancel := context.WithTimeout(parent, 10*time.Minute)
	defer ccancel()
	if c, err := countKernel(cctx, n.topo.Node); err != nil {
		res.KernelErr = err.Error()
	} else {
		res.Kernel = &c
	}
	return nil
}

// takeMeasures takes the timed measures, then the process's memory and
// CPU once the churn has settled.
func (r *runner) takeMeasures(ctx context.Context, res *Result, p proxy, n *node, started time.Time) error {
	pid := p.PID()
	res.phase = "first sync"
	first := r.probes.first()
	at, err := n.awaitAnswer(ctx, first, first.current(), started)
	if err != nil {
		return err
	}
	res.FirstSync = at.Sub(started)
	if res.CPUFirst, err = cpuTime(pid); err != nil {
		return err
	}
	if res.FullSync, err = awaitFullSync(ctx, n.http); err != nil {
		return err
	}
	res.phase = "one change"
	for range r.cfg.Changes {
		if err := settle(ctx, p, res.MinSync); err != nil {
			return err
		}
		took, err := r.change(ctx, n)
		if err != nil {
			return err
		}
		res.Changes = append(res.Changes, took)
	}
	res.phase = "churn"
	if err := settle(ctx, p, res.MinSync); err != nil {
		return err
	}
	cpu0, err := cpuTime(pid)
	if err != nil {
		return err
	}
	if err := r.churn(ctx, n, res); err != nil {
		return err
	}
	res.phase = "settling after the churn"
	if err := settle(ctx, p, 0); err != nil {
		return err
	}
	if res.CPUTotal, err = cpuTime(pid); err != nil {
		return err
	}
	res.CPUChurn = res.CPUTotal - cpu0
	res.SteadyRSS, res.PeakRSS, err = memory(pid)
	return err
}

// atCap reads the peak RSS and the CPU time of a run that broke off, as
// far as they got.
func atCap(res *Result, pid int) {
	if res.PeakRSS == 0 {
		_, res.PeakRSS, _ = memory(pid) // an exited process has none
	}
	if res.CPUTotal == 0 {
		res.CPUTotal, _ = cpuTime(pid)
	}
}

// change flips one probe service's endpoint and times it into the kernel.
func (r *runner) change(ctx context.Context, n *node) (time.Duration, error) {
	svc := r.probes.acquire()
	if svc == nil {
		return 0, errors.New("every probe service is busy") // none is measured between changes
	}
	return r.measureFlip(ctx, n, svc, func() {})
}

// pollGap is how often metrics are read while waiting.
const pollGap = 50 * time.Millisecond

// awaitFullSync waits until the proxy's metrics hold its first full sync
// and returns its duration (the mean, should there be more than one).
func awaitFullSync(ctx context.Context, c *http.Client) (time.Duration, error) {
	var last error
	for {
		n, sum, err := fullSyncs(ctx, c)
		if err == nil && n > 0 {
			return sum / time.Duration(n), nil
		}
		last = err
		select {
		case <-ctx.Done():
			return 0, errors.Join(context.Cause(ctx), fmt.Errorf("no full sync in the metrics: %w", orNone(last, "none yet")))
		case <-time.After(pollGap):
		}
	}
}

// settle waits until the proxy is idle in two readings pollGap apart that
// show the same syncs, then until minSync has passed since its last sync
// ended, so the next change is not held back by the rate limit.
func settle(ctx context.Context, p proxy, minSync time.Duration) error {
	var prev kubeproxy.Snapshot
	var last error
	for {
		s, err := p.Scrape(ctx)
		if err == nil && idle(s) && idle(prev) && sameSyncs(s, prev) {
			return pace(ctx, lastSync(s).Add(minSync+100*time.Millisecond))
		}
		prev, last = s, err
		select {
		case <-ctx.Done():
			return errors.Join(context.Cause(ctx), fmt.Errorf("proxy not idle (%v): %w", s, orNone(last, "metrics read")))
		case <-time.After(pollGap):
		}
	}
}

// orNone is err, or an error saying what when err is nil.
func orNone(err error, what string) error {
	if err == nil {
		return errors.New(what)
	}
	return err
}

// pace waits until t.
func pace(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}
