// Package soak is Weir's soak test (make soak, hack/soak): a real control
// plane, Weir in a network-namespace node with the kubernetes source, pods
// answering with their names, seeded churn of Services and EndpointSlices
// at a bounded rate, faults at random moments (Weir killed and restarted,
// kube-apiserver restarted, Weir's kernel objects removed by hand, hostile
// plugins, conflicting objects, the xtables lock held), and a checker that
// at every quiescent point runs `weir verify` against the node's kernel,
// while probes count failed and misrouted connections and a few
// long-lived connections must survive everything.
//
// The seed fixes the sequence of changes and faults; their timing depends
// on the machine, so a failure replays with the same seed as the same
// story, not the same schedule.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/test/programt"
)

// Config is one soak run.
type Config struct {
	// Mode is nftables, iptables (iptables.backend auto), iptables-nft,
	// iptables-legacy or ipvs.
	Mode string
	// Source is kubernetes (the real control plane) or files (a folder of
	// manifests: no control plane, and conflicts the API server refuses).
	Source   string
	Duration time.Duration
	// Seed seeds every random choice; 0 picks one (printed at the start).
	Seed uint64
	// Services is how many churned services exist at the start; the churn
	// keeps between half and one and a half times as many.
	Services int
	// Pods is how many pod namespaces serve the endpoints.
	Pods int
	// Rate is churn operations per second.
	Rate float64
	// Round is the mean time of churn between two quiescent points.
	Round time.Duration
	// SyncPeriod and MinSyncPeriod are Weir's.
	SyncPeriod, MinSyncPeriod time.Duration
	// LockHold is how long the xtables lock is held.
	LockHold time.Duration
	// Weir is the weir binary; Plugins the folder of the built example
	// plugins (make plugins); Repo the repository's root.
	Weir, Plugins, Repo string
	// NoPlugins runs Weir without hook plugins (and so without the
	// plugin faults): in a VM whose CPU the plugins' compiler cannot use.
	NoPlugins bool
	// Guests, when set, is a folder holding the test guests benign.wasm
	// and hostile.wasm, built beforehand (in a VM, which has no Go);
	// otherwise the soak builds them.
	Guests string
	// Dir is the run's folder (logs, configuration); it is removed at the
	// end when every target was met, unless Keep.
	Dir  string
	Keep bool
	// Log receives the progress lines.
	Log io.Writer
}

// backendMode is Weir's mode key for Mode.
func (c *Config) backendMode() string {
	if strings.HasPrefix(c.Mode, "iptables") {
		return "iptables"
	}
	return c.Mode
}

// flavour is Weir's iptables.backend for Mode, or "".
func (c *Config) flavour() string {
	switch c.Mode {
	case "iptables":
		return "auto"
	case "iptables-nft":
		return "nft"
	case "iptables-legacy":
		return "legacy"
	}
	return ""
}

func (c *Config) check() error {
	switch c.Mode {
	case "nftables", "iptables", "iptables-nft", "iptables-legacy", "ipvs":
	default:
		return fmt.Errorf("mode %q: use nftables, iptables, iptables-nft, iptables-legacy or ipvs", c.Mode)
	}
	if c.Source != "kubernetes" && c.Source != "files" {
		return fmt.Errorf("source %q: use kubernetes or files", c.Source)
	}
	switch {
	case c.Duration <= 0:
		return errors.New("duration: want a positive duration")
	case c.Services < 2 || c.Pods < 4:
		return errors.New("want at least 2 services and 4 pods")
	case c.Rate <= 0 || c.Round <= 0 || c.SyncPeriod <= 0 || c.MinSyncPeriod < 0 || c.LockHold <= 0:
		return errors.New("rate, round, syncPeriod and lockHold must be positive")
	case c.Weir == "" || c.Plugins == "" || c.Repo == "" || c.Dir == "":
		return errors.New("weir, plugins, repo and dir are required")
	case c.Source == "kubernetes" && c.Mode == "ipvs":
		return errors.New("mode ipvs runs in the VM, which has no control plane: use --source files")
	}
	files := []string{c.Weir, filepath.Join(c.Plugins, "canary.wasm"), filepath.Join(c.Plugins, "affinity.wasm")}
	if c.NoPlugins {
		files = files[:1]
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w (make build plugins)", err)
		}
	}
	return nil
}

// run is one soak in progress.
type run struct {
	cfg       *Config
	t         *programt.T
	c         *cluster
	churn     *churner
	faultRNG  *rand.Rand
	d         *daemon
	verify    *verifier
	probes    *prober
	held      *holder
	win       *windows
	rep       *report
	guests    *guests
	env       []string
	lockFile  string
	pluginDir string
	heldSvc   *service
	files     *filesStore // with the files source
	described map[*service]description
	// lastWrite is the churn's last API write.
	lastWrite time.Time
	logMu     sync.Mutex
}

// Run runs the soak and returns its report; the error is for a soak that
// could not run, not for missed targets (see Report.Failures).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	s := &run{cfg: &cfg, win: &windows{}, lockFile: filepath.Join(cfg.Dir, "xtables.lock"),
		pluginDir: filepath.Join(cfg.Dir, "plugins")}
	s.rep = newReport(&cfg)
	s.logf("soak: mode %s, source %s, seed %d, %v, %d services, %d pods, churn %.1f/s, syncPeriod %v (folder %s)",
		cfg.Mode, cfg.Source, cfg.Seed, cfg.Duration, cfg.Services, cfg.Pods, cfg.Rate, cfg.SyncPeriod, cfg.Dir)
	s.t = programt.New("soak", cfg.Dir, s.logf)
	defer s.t.Close()
	err := s.setup(ctx)
	if err == nil {
		err = s.soak(ctx)
	}
	rep := s.rep.finish(s, err)
	if err != nil {
		return rep, err
	}
	if len(rep.Failures) == 0 && !cfg.Keep {
		defer os.RemoveAll(cfg.Dir) // after the cleanups, which use it
	}
	return rep, nil
}

func (s *run) logf(format string, args ...any) {
	if s.cfg.Log == nil {
		return
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	fmt.Fprintf(s.cfg.Log, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05.000")}, args...)...)
}

// setup builds everything the soak needs and starts Weir over the initial
// services.
func (s *run) setup(ctx context.Context) error {
	var err error
	s.guests = &guests{benign: filepath.Join(s.cfg.Guests, "benign.wasm"), hostile: filepath.Join(s.cfg.Guests, "hostile.wasm")}
	if s.cfg.Guests == "" && !s.cfg.NoPlugins {
		if s.guests, err = buildGuests(ctx, s.cfg.Repo, s.cfg.Dir); err != nil {
			return err
		}
	}
	if s.c, err = startCluster(ctx, s.t, s.cfg); err != nil {
		return err
	}
	if err := os.MkdirAll(s.pluginDir, 0o755); err != nil {
		return err
	}
	for _, v := range victimSlots {
		if s.cfg.NoPlugins {
			break
		}
		if err := installGuest(s.pluginDir, v.name, s.guests.benign); err != nil {
			return err
		}
	}
	manifests := filepath.Join(s.cfg.Dir, "manifests")
	config := filepath.Join(s.cfg.Dir, "weir.yaml")
	text := weirConfig(s.cfg, s.c.kubeconfig, manifests, s.pluginDir, filepath.Join(s.cfg.Dir, "cache"))
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		return err
	}
	s.env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") }),
		"XTABLES_LOCKFILE="+s.lockFile)
	s.d = newDaemon(s.cfg.Weir, config, s.cfg.Dir, s.c.topo.Node, s.env, s.logf)
	// The compilation cache is safe to share: wazero writes each entry
	// whole through a rename.
	s.verify = &verifier{bin: s.cfg.Weir, config: config, cacheDir: filepath.Join(s.cfg.Dir, "cache"),
		node: s.c.topo.Node, env: s.env}
	seed := s.cfg.Seed
	var st store = &apiStore{client: s.c.client, pods: s.c.pods}
	if s.cfg.Source == "files" {
		fs := newFilesStore(manifests, s.c.pods)
		if err := os.MkdirAll(manifests, 0o755); err != nil {
			return err
		}
		if err := fs.writeNode(s.c.topo.NodeIP, s.c.topo.NodeIP6); err != nil {
			return err
		}
		st, s.files = fs, fs
	}
	s.churn = &churner{rng: rand.New(rand.NewPCG(seed, 1)), w: st,
		pods: len(s.c.pods), min: max(1, s.cfg.Services/2), max: s.cfg.Services * 3 / 2, ops: map[string]int{}, logf: s.logf}
	s.faultRNG = rand.New(rand.NewPCG(seed, 2))
	begin := time.Now()
	if err := s.churn.populate(ctx, s.cfg.Services); err != nil {
		return err
	}
	if err := s.createHeld(ctx); err != nil {
		return err
	}
	s.lastWrite = time.Now()
	s.logf("created %d services in %v", s.cfg.Services, time.Since(begin).Round(time.Millisecond))
	return s.startWeir(ctx)
}

// createHeld creates the service the long-lived connections go through:
// a NodePort service over the two echoing pods, never changed.
func (s *run) createHeld(ctx context.Context) error {
	s.heldSvc = &service{ns: heldNS, name: "held", kind: corev1.ServiceTypeNodePort, held: true,
		ports:       []svcPort{{name: "echo", proto: corev1.ProtocolTCP, port: echoPort, target: echoPort}},
		annotations: map[string]string{}}
	s.heldSvc.slices = []*slice{{name: "held-1", family: 4, eps: []endpoint{{pod: 0, local: true}, {pod: 1, local: true}}}}
	return s.churn.w.createService(ctx, s.heldSvc)
}

// startWeir starts the daemon over the initial services and waits for
// the kernel to match the plan.
func (s *run) startWeir(ctx context.Context) error {
	p, err := s.d.start()
	if err != nil {
		return err
	}
	c := s.converge(ctx, p.started, p.started, 3*time.Minute)
	s.rep.initial = c
	s.rep.initialFirstSync = p.firstSync()
	if !c.clean {
		return fmt.Errorf("the kernel never matched the plan after the first start: %s; the end of %s:\n%s",
			describe(c), p.logPath, tail(p.logPath, 10))
	}
	s.logf("weir synced %d service ports in %v after its start; weir verify is clean", c.last.Services,
		s.rep.initialFirstSync.Round(time.Millisecond))
	return nil
}

// soak runs rounds of churn and faults until the duration has passed.
func (s *run) soak(ctx context.Context) error {
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	s.probes = &prober{client: s.c.topo.Client, windows: s.win, settle: 3*s.cfg.MinSyncPeriod + 2*time.Second,
		explain: s.planFor}
	s.publish()
	wg.Go(func() { s.probes.run(bg, 100*time.Millisecond) })
	s.held = &holder{client: s.c.topo.Client, windows: s.win}
	wg.Go(func() { s.held.run(bg, heldVias(s.heldSvc, s.c.topo.NodeIP), time.Second) })
	wg.Go(func() { s.sample(bg) })
	wg.Go(func() { s.watchStalls(bg) })

	end := time.Now().Add(s.cfg.Duration)
	cycle := s.faultCycle()
	var pending *pendingUndo
	for round := 0; time.Now().Before(end) && ctx.Err() == nil; round++ {
		if pending != nil {
			s.undo(ctx, round, pending)
		}
		f := cycle[round%len(cycle)]
		if round > 0 && round%len(cycle) == 0 {
			cycle = s.faultCycle()
		}
		var err error
		if pending, err = s.round(ctx, round, f); err != nil {
			return err
		}
	}
	if pending != nil {
		s.undo(ctx, -1, pending)
	}
	took, clean := s.d.term(30 * time.Second)
	s.rep.stops = append(s.rep.stops, took)
	if !clean {
		s.rep.stopsKilled++
	}
	return nil
}

// faultCycle is a seeded order of every fault that applies to the mode;
// the soak goes through it round by round, then through a new one.
func (s *run) faultCycle() []fault {
	var fs []fault
	for _, f := range faults {
		if f.applies(s) {
			fs = append(fs, f)
		}
	}
	s.faultRNG.Shuffle(len(fs), func(i, j int) { fs[i], fs[j] = fs[j], fs[i] })
	return fs
}

// pendingUndo is a fault that lasts until the next round.
type pendingUndo struct {
	kind   string
	window int
	undo   func(ctx context.Context) (time.Time, string, error)
}

// round churns for about cfg.Round, injects f at a random moment of it,
// then waits for the kernel to match the plan and records how long it took.
func (s *run) round(ctx context.Context, round int, f fault) (*pendingUndo, error) {
	length := time.Duration(float64(s.cfg.Round) * (0.5 + s.faultRNG.Float64()))
	at := time.Duration(s.faultRNG.Float64() * float64(length))
	s.churnFor(ctx, at)
	w := s.win.open(f.name)
	s.logf("round %d: fault %q", round, f.name)
	in, err := f.inject(ctx, s)
	if err != nil {
		s.win.close(w)
		s.rep.injectFailed = append(s.rep.injectFailed, fmt.Sprintf("round %d: %s: %v", round, f.name, err))
		s.logf("round %d: could not inject %q: %v", round, f.name, err)
		in = injected{at: time.Now()}
	}
	s.churnFor(ctx, length-at)
	res := s.measure(ctx, round, f.name, "fault", in)
	if in.note != "" {
		s.logf("round %d: %s: %s", round, f.name, in.note)
	}
	s.logf("round %d: %s", round, res.summary())
	if in.undo != nil {
		return &pendingUndo{kind: f.name, window: w, undo: in.undo}, nil
	}
	s.win.close(w)
	return nil, nil
}

// undo ends a fault that lasted a round and measures the convergence.
func (s *run) undo(ctx context.Context, round int, p *pendingUndo) {
	at, note, err := p.undo(ctx)
	if err != nil {
		s.rep.injectFailed = append(s.rep.injectFailed, fmt.Sprintf("round %d: undo %s: %v", round, p.kind, err))
	}
	res := s.measure(ctx, round, p.kind, "undone", injected{at: at, note: note})
	s.logf("round %d: %s: %s", round, p.kind, note)
	s.logf("round %d: %s", round, res.summary())
	s.win.close(p.window)
}

// measure waits for convergence after a fault and records the result.
func (s *run) measure(ctx context.Context, round int, kind, phase string, in injected) *faultResult {
	since := in.at
	if s.lastWrite.After(since) {
		since = s.lastWrite
	}
	limit := 3*s.cfg.SyncPeriod + 30*time.Second + in.limit
	res := &faultResult{round: round, kind: kind, phase: phase, note: in.note, restart: in.restart}
	res.conv = s.converge(ctx, since, s.lastWrite, limit)
	if res.conv.clean && s.cfg.Mode == "nftables" {
		s.checkListings(ctx, round, kind)
	}
	res.stalled = s.rep.stalledDuring(in.at.Add(-3*s.cfg.SyncPeriod), time.Now())
	if in.restart {
		p := s.d.current()
		res.firstSync, res.pluginLoad = p.firstSync(), p.pluginLoad()
		res.services = len(s.churn.svcs)
	}
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	res.healthz, _ = s.d.healthz(hctx)
	cancel()
	s.rep.results = append(s.rep.results, res)
	return res
}

// churnFor makes churn steps at the configured rate for d, restarting
// Weir if it exited on its own.
func (s *run) churnFor(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	interval := time.Duration(float64(time.Second) / s.cfg.Rate)
	end := time.Now().Add(d)
	if s.probes != nil {
		s.probes.churning.Store(true)
		defer s.probes.churning.Store(false)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.checkAlive()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s.churn.step(wctx)
		cancel()
		s.lastWrite = time.Now()
		s.publish()
	}
}

// checkAlive restarts Weir when it exited by itself, and records it.
func (s *run) checkAlive() {
	if s.d.running() {
		return
	}
	p := s.d.current()
	s.rep.crashes = append(s.rep.crashes, fmt.Sprintf("weir run exited (%v); the end of %s:\n%s", p.err, p.logPath, tail(p.logPath, 20)))
	s.logf("weir run exited by itself: %v; starting it again", p.err)
	if _, err := s.d.start(); err != nil {
		s.logf("start weir: %v", err)
	}
}

// publish hands the probes the current destinations: each with the pods
// it may reach, owned by the oldest service that claims it.
func (s *run) publish() {
	if s.probes == nil {
		return
	}
	nodeIPs := map[int]netip.Addr{4: s.c.topo.NodeIP, 6: s.c.topo.NodeIP6}
	owner := map[netip.AddrPort]*service{}
	for _, svc := range s.churn.svcs {
		for _, d := range svc.destinations(nodeIPs) {
			if o := owner[d.addr]; o == nil || svc.older(o) {
				owner[d.addr] = svc
			}
		}
	}
	var ts []target
	writes := make(map[string]time.Time, len(s.churn.svcs))
	for _, svc := range s.churn.svcs {
		writes[svc.key()] = svc.lastWrite
		for _, d := range svc.destinations(nodeIPs) {
			if owner[d.addr] != svc {
				continue
			}
			names := map[string]bool{}
			for pod := range svc.allowed(d) {
				names[s.c.pods[pod].Name] = true
			}
			ts = append(ts, target{service: svc.key(), dest: d, allowed: names, lastWrite: svc.lastWrite,
				model: s.describeCached(svc)})
		}
	}
	s.faultRNG.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	s.probes.writes.Store(&writes)
	s.probes.targets.Store(&ts)
	s.probes.published.Store(time.Now().UnixNano())
}

// describeCached is svc.describe, computed again only after a write.
func (s *run) describeCached(svc *service) string {
	if d, ok := s.described[svc]; ok && d.at.Equal(svc.lastWrite) {
		return d.text
	}
	if s.described == nil || len(s.described) > 4*len(s.churn.svcs) {
		s.described = map[*service]description{} // drop the deleted ones
	}
	names := make([]string, len(s.c.pods))
	for i, p := range s.c.pods {
		names[i] = p.Name
	}
	d := description{at: svc.lastWrite, text: svc.describe(names)}
	s.described[svc] = d
	return d.text
}

type description struct {
	at   time.Time
	text string
}

// planFor runs weir plan in the node and returns the blocks of service
// (namespace/name), for a report.
func (s *run) planFor(ctx context.Context, service string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := s.c.topo.Node.Command(ctx, s.cfg.Weir, "plan", "--config", s.verify.config, "--hooks-cache-dir",
		s.verify.cacheDir, "--log-level", "error")
	cmd.Env = s.env
	b, err := cmd.Output() // exit 1 after a plugin failed still prints the plan
	out := string(b)
	if err != nil && out == "" {
		return fmt.Sprintf("weir plan: %v", err)
	}
	var keep []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "service ") {
			in = strings.HasPrefix(line, "service "+service+":")
		}
		if in {
			keep = append(keep, line)
		}
	}
	if len(keep) == 0 {
		return "(no such service in the plan)"
	}
	return strings.Join(keep, "\n")
}

// flavour is the iptables flavour Weir uses: the configured one, or what
// it logged it picked for auto.
func (s *run) flavour() string {
	if f := s.cfg.flavour(); f != "auto" {
		return f
	}
	if s.d == nil {
		return "nft"
	}
	if p := s.d.current(); p != nil {
		if f := p.loggedFlavour(); f != "" {
			return f
		}
	}
	return "nft"
}

// sample records Weir's memory and goroutines and the load every 5 s.
func (s *run) sample(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := s.d.scrape(sctx)
		cancel()
		if err == nil {
			smp := sample{at: time.Now(), rss: m[mRSS], goroutines: m[mGoroutines], proc: s.d.startCount()}
			if p := s.d.current(); p != nil && p.cmd.Process != nil {
				if n, err := nodePortListeners(p.cmd.Process.Pid); err == nil {
					smp.listeners = float64(n)
				}
			}
			s.rep.addSample(smp)
		}
		s.rep.addLoad(loadAverage())
	}
}

// stallLimit is how long the soak's own 100 ms ticker may go without
// ticking before it counts as the machine stalling.
const stallLimit = 2 * time.Second

// watchStalls records each time the machine stopped running the soak (and
// with it Weir and the control plane) for more than stallLimit, as a
// virtual machine paused by its host does, as a fault window of its own:
// what fails then is the machine's, not Weir's.
func (s *run) watchStalls(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		if gap := now.Sub(last); gap > stallLimit {
			s.win.add("machine stalled", last, now)
			s.rep.addStall(last, gap)
			s.logf("the machine stalled for %v (nothing ran, the soak's ticker included)", gap.Round(time.Millisecond))
		}
		last = now
	}
}

// loadAverage is the one-minute load average, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	if _, err := fmt.Sscanf(string(b), "%f", &l); err != nil {
		return -1
	}
	return l
}
