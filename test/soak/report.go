package soak

import (
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Report is the outcome of a soak run.
type Report struct {
	// Text is the report for people: figures, targets, the seed.
	Text string
	// Failures lists every missed target; empty when the run passed.
	Failures []string
}

// Targets the report checks, besides the zeros.
const (
	restartTarget = 2 * time.Second // from a weir start to its first sync
	stopTarget    = 5 * time.Second // from SIGTERM to exit
	// RSS and goroutines may grow this much between the first and the last
	// third of the run (both relative and absolute must be exceeded).
	rssGrowth, rssGrowthBytes = 0.25, 24 << 20
	goroutineGrowth           = 0.25
	goroutineGrowthCount      = 10
)

// faultResult is one convergence after a fault, or after its end.
type faultResult struct {
	round     int
	kind      string
	phase     string // "fault", or "undone" for the end of a fault that lasted a round
	note      string
	restart   bool
	conv      convergence
	firstSync time.Duration // after a restart: from the start to the first sync
	// pluginLoad is the part of firstSync before "Starting Weir": loading
	// the plugins (from the compilation cache) and the configuration.
	pluginLoad time.Duration
	services   int // after a restart: how many services the API held
	healthz    int
	// stalled says the machine stalled around the fault: its times are
	// the machine's, not Weir's, and are not held to the targets.
	stalled bool
}

func (r *faultResult) summary() string {
	s := fmt.Sprintf("%s (%s): %s", r.kind, r.phase, describe(r.conv))
	if r.restart {
		s += fmt.Sprintf("; first sync %v after the start (%v of it loading plugins; %d services)",
			r.firstSync.Round(time.Millisecond), r.pluginLoad.Round(time.Millisecond), r.services)
	}
	if r.stalled {
		s += "; the machine stalled meanwhile (times not held to the targets)"
	}
	return s + fmt.Sprintf("; /healthz %d", r.healthz)
}

// describe says how a convergence went.
func describe(c convergence) string {
	switch {
	case c.clean:
		return fmt.Sprintf("converged in %v (%d verify runs)", c.took.Round(time.Millisecond), c.verifies)
	case c.err != nil:
		return fmt.Sprintf("NOT converged after %v: weir verify could not compare: %v", c.waited.Round(time.Millisecond), c.err)
	case c.last != nil:
		return fmt.Sprintf("NOT converged after %v: %d divergences", c.waited.Round(time.Millisecond), len(c.last.Divergences))
	}
	return fmt.Sprintf("NOT converged after %v: Weir never became quiet (changes pending or /metrics unreachable)",
		c.waited.Round(time.Millisecond))
}

type sample struct {
	at              time.Time
	rss, goroutines float64
	// listeners are the health-check node ports Weir listens on, one
	// goroutine each (see nodePortListeners).
	listeners float64
	proc      int
}

// report collects the run's figures.
type report struct {
	cfg   *Config
	run   *run
	start time.Time

	initial          convergence
	initialFirstSync time.Duration
	results          []*faultResult
	injectFailed     []string
	crashes          []string
	stops            []time.Duration
	stopsKilled      int
	killsMidSync     int
	// listings counts the nft listings of the ruleset at quiescent points
	// (nftables mode); listFailures names those that failed.
	listings     int
	listFailures []string

	mu      sync.Mutex
	samples []sample
	load    []float64
	stalls  []stall
}

// stall is a time the machine ran nothing, the soak included.
type stall struct {
	at  time.Time
	gap time.Duration
}

func (r *report) addStall(at time.Time, gap time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stalls = append(r.stalls, stall{at, gap})
}

// stalledDuring reports whether a stall overlapped [from, to].
func (r *report) stalledDuring(from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.stalls {
		if !st.at.After(to) && !st.at.Add(st.gap).Before(from) {
			return true
		}
	}
	return false
}

func newReport(cfg *Config) *report { return &report{cfg: cfg, start: time.Now()} }

func (r *report) addSample(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
}

func (r *report) addLoad(l float64) {
	if l < 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.load = append(r.load, l)
}

// finish writes the report and checks the targets; runErr is why the
// soak stopped early, if it did.
func (r *report) finish(s *run, runErr error) *Report {
	r.run = s
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	var fails []string
	fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
	cfg := r.cfg
	fmt.Fprintf(&b, "Weir soak, mode %s, source %s, seed %d\n", cfg.Mode, cfg.Source, cfg.Seed)
	fmt.Fprintf(&b, "replay: make soak SOAK_MODE=%s SOAK_SEED=%d SOAK_DURATION=%v SOAK_SERVICES=%d "+
		"SOAK_FLAGS=\"--source %s --pods %d --rate %g --round %v --lock-hold %v --sync-period %v --min-sync-period %v\"\n",
		cfg.Mode, cfg.Seed, cfg.Duration, cfg.Services, cfg.Source, cfg.Pods, cfg.Rate, cfg.Round, cfg.LockHold,
		cfg.SyncPeriod, cfg.MinSyncPeriod)
	fmt.Fprintf(&b, "ran %v: %d services at the start, %d pods, churn %.1f operations/s, rounds of about %v, syncPeriod %v, minSyncPeriod %v\n",
		time.Since(r.start).Round(time.Second), cfg.Services, cfg.Pods, cfg.Rate, cfg.Round, cfg.SyncPeriod, cfg.MinSyncPeriod)
	if len(r.load) > 0 {
		fmt.Fprintf(&b, "load: one-minute load average %.2f median, %.2f max, on %d CPUs shared by the control plane, Weir, the churn and the probes\n",
			median(r.load), slices.Max(r.load), numCPU())
	}
	for _, st := range r.stalls {
		fmt.Fprintf(&b, "machine stall: nothing ran (the soak included) for %v from %s; what failed meanwhile counts as inside a fault window\n",
			st.gap.Round(time.Millisecond), st.at.UTC().Format("15:04:05.000"))
	}
	r.writeChurn(&b, s)
	r.writeConvergence(&b, fail)
	r.writeProbes(&b, s, fail)
	r.writeListings(&b, fail)
	r.writeProcess(&b, fail)
	if len(r.injectFailed) > 0 {
		b.WriteString("faults that could not be injected:\n")
		for _, f := range r.injectFailed {
			fmt.Fprintf(&b, "  %s\n", f)
		}
		fail("%d faults could not be injected", len(r.injectFailed))
	}
	if runErr != nil {
		fmt.Fprintf(&b, "the soak stopped early: %v\n", runErr)
		fail("the soak could not run to the end")
	}
	if len(fails) == 0 {
		b.WriteString("result: PASS, every target met\n")
	} else {
		fmt.Fprintf(&b, "result: FAIL, %d targets missed (replay with seed %d):\n", len(fails), cfg.Seed)
		for _, f := range fails {
			fmt.Fprintf(&b, "  - %s\n", f)
		}
		fmt.Fprintf(&b, "logs: %s\n", cfg.Dir)
	}
	return &Report{Text: b.String(), Failures: fails}
}

func (r *report) writeChurn(b *strings.Builder, s *run) {
	if s.churn == nil {
		return
	}
	ch := s.churn
	total := 0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(ch.ops)) {
		total += ch.ops[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, ch.ops[k]))
	}
	fmt.Fprintf(b, "churn: %d operations (%s), %d writes, %d failed; %d services at the end\n",
		total, strings.Join(parts, ", "), ch.w.writeCount(), ch.fails, len(ch.svcs))
}

// writeConvergence lists the time to converge by fault and checks the
// targets: every quiescent point converged, within one syncPeriod of the
// fault (or the last change), a restart's first sync within restartTarget.
func (r *report) writeConvergence(b *strings.Builder, fail func(string, ...any)) {
	cfg := r.cfg
	fmt.Fprintf(b, "first start: first sync %v after the start, verified clean: %v\n",
		r.initialFirstSync.Round(time.Millisecond), r.initial.clean)
	type agg struct {
		n, clean int
		took     []time.Duration
		first    []time.Duration
		load     []time.Duration
	}
	byKind := map[string]*agg{}
	var order []string
	for _, res := range r.results {
		key := res.kind
		if res.phase != "fault" {
			key += " (" + res.phase + ")"
		}
		a := byKind[key]
		if a == nil {
			a = &agg{}
			byKind[key] = a
			order = append(order, key)
		}
		a.n++
		if res.conv.clean {
			a.clean++
			a.took = append(a.took, res.conv.took)
		}
		if res.restart {
			a.first = append(a.first, res.firstSync)
			a.load = append(a.load, res.pluginLoad)
		}
		r.checkResult(res, fail)
	}
	sort.Strings(order)
	var missing []string
	for _, f := range faults {
		if _, ok := byKind[f.name]; !ok && f.applies(r.run) {
			missing = append(missing, f.name)
		}
	}
	fmt.Fprintf(b, "quiescent points: %d; time to converge after each kind of fault (from the fault, or the last change after it; target <= syncPeriod %v):\n",
		len(r.results), cfg.SyncPeriod)
	for _, k := range order {
		a := byKind[k]
		line := fmt.Sprintf("  %-40s %3d, converged %3d", k, a.n, a.clean)
		if len(a.took) > 0 {
			line += fmt.Sprintf(", median %v, max %v", medianDur(a.took), slices.Max(a.took).Round(time.Millisecond))
		}
		if len(a.first) > 0 {
			line += fmt.Sprintf("; first sync after the start: median %v, max %v (target <= %v; loading plugins: median %v)",
				medianDur(a.first), slices.Max(a.first).Round(time.Millisecond), restartTarget, medianDur(a.load))
		}
		b.WriteString(line + "\n")
	}
	if len(missing) > 0 {
		fmt.Fprintf(b, "  not reached in this run (the seeded cycle goes on): %s\n", strings.Join(missing, ", "))
	}
	divs := 0
	for _, res := range r.results {
		if !res.conv.clean && res.conv.last != nil {
			divs += len(res.conv.last.Divergences)
		}
	}
	fmt.Fprintf(b, "divergences after convergence: %d (target 0)\n", divs)
	for _, res := range r.results {
		if res.conv.clean || res.conv.last == nil {
			continue
		}
		fmt.Fprintf(b, "  round %d, %s (%s; %s):\n", res.round, res.kind, res.phase, res.note)
		for i, d := range res.conv.last.Divergences {
			if i == maxExamples {
				fmt.Fprintf(b, "    ... and %d more\n", len(res.conv.last.Divergences)-i)
				break
			}
			fmt.Fprintf(b, "    %s\n", d.Message)
		}
	}
}

// writeListings reports the nft tool's listings of the ruleset (nftables
// mode): an operator's first look at a node must work.
func (r *report) writeListings(b *strings.Builder, fail func(string, ...any)) {
	if r.listings == 0 {
		return
	}
	fmt.Fprintf(b, "nft listings (list ruleset, -j, -t) at quiescent points: %d, %d failed (target 0)\n", r.listings, len(r.listFailures))
	for i, f := range r.listFailures {
		if i == maxExamples {
			fmt.Fprintf(b, "  ... and %d more\n", len(r.listFailures)-i)
			break
		}
		fmt.Fprintf(b, "  %s\n", f)
	}
	if len(r.listFailures) > 0 {
		fail("%d nft listings of the ruleset failed", len(r.listFailures))
	}
}

// checkResult adds the targets one convergence missed.
func (r *report) checkResult(res *faultResult, fail func(string, ...any)) {
	where := fmt.Sprintf("round %d, %s (%s)", res.round, res.kind, res.phase)
	switch {
	case !res.conv.clean:
		fail("%s: %s", where, describe(res.conv))
		return
	case res.stalled:
		return // converged; its times are the stall's
	case res.conv.took > r.cfg.SyncPeriod:
		fail("%s: converged in %v, more than syncPeriod %v", where, res.conv.took.Round(time.Millisecond), r.cfg.SyncPeriod)
	}
	if res.restart && (res.firstSync == 0 || res.firstSync > restartTarget) {
		fail("%s: first sync %v after the start with %d services, target %v", where,
			res.firstSync.Round(time.Millisecond), res.services, restartTarget)
	}
	if res.healthz != http.StatusOK {
		fail("%s: /healthz answered %d once converged, want 200", where, res.healthz)
	}
}

func (r *report) writeProbes(b *strings.Builder, s *run, fail func(string, ...any)) {
	if s.probes != nil {
		st := s.probes.snapshot()
		fmt.Fprintf(b, "probes: %d connections to settled services, %d answered by an allowed pod\n", st.total, st.ok)
		fmt.Fprintf(b, "  outside fault windows: %d failed, %d reached a pod not in the plan (target 0 each)\n", st.failed, st.wrong)
		fmt.Fprintf(b, "  inside fault windows: %d failed, %d reached a pod not in the plan (not a target)", st.failedIn, st.wrongIn)
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(st.byWindow)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, st.byWindow[k]))
		}
		if len(parts) > 0 {
			fmt.Fprintf(b, ": %s", strings.Join(parts, ", "))
		}
		b.WriteString("\n")
		for _, e := range st.examples {
			fmt.Fprintf(b, "    %s\n", e)
		}
		if st.failed > 0 || st.wrong > 0 {
			fail("probes outside fault windows: %d failed, %d reached a pod not in the plan", st.failed, st.wrong)
		}
		if st.total == 0 {
			fail("no probe ran")
		}
	}
	if s.held != nil {
		h := s.held
		h.mu.Lock()
		lost := 0
		for _, n := range h.lostIn {
			lost += n
		}
		fmt.Fprintf(b, "held connections: %d opened through the held service's cluster IP and node port, %d lost (target 0)\n", h.opened, lost)
		for _, l := range h.lost {
			fmt.Fprintf(b, "  %s\n", l)
		}
		h.mu.Unlock()
		if lost > 0 {
			fail("%d established connections lost", lost)
		}
	}
}

// writeProcess reports Weir's restarts, stops, crashes, memory and
// goroutines.
func (r *report) writeProcess(b *strings.Builder, fail func(string, ...any)) {
	if len(r.stops) > 0 {
		fmt.Fprintf(b, "SIGTERM: %d stops, median %v, max %v (target <= %v), %d needed SIGKILL; %d SIGKILLs landed inside a sync\n",
			len(r.stops), medianDur(r.stops), slices.Max(r.stops).Round(time.Millisecond), stopTarget, r.stopsKilled, r.killsMidSync)
		if m := slices.Max(r.stops); m > stopTarget || r.stopsKilled > 0 {
			fail("weir run took up to %v to stop after SIGTERM (%d did not stop by themselves)", m.Round(time.Millisecond), r.stopsKilled)
		}
	}
	for _, c := range r.crashes {
		fmt.Fprintf(b, "crash: %s\n", c)
	}
	if len(r.crashes) > 0 {
		fail("weir run exited by itself %d times", len(r.crashes))
	}
	if len(r.samples) == 0 {
		return
	}
	rss := func(s sample) float64 { return s.rss }
	gor := func(s sample) float64 { return s.goroutines }
	fmt.Fprintf(b, "weir run: RSS %s; goroutines %s (%d samples, every 5 s, across %d processes)\n",
		span(r.samples, rss, mib), span(r.samples, gor, count), len(r.samples), r.samples[len(r.samples)-1].proc)
	first, last := thirds(r.samples)
	if len(first) == 0 {
		fmt.Fprintf(b, "  growth not judged: the run needs %v after a warm-up of %v\n", growthSpan, growthWarmUp)
		return
	}
	r0, r1 := medianOf(first, rss), medianOf(last, rss)
	g0, g1 := medianOf(first, gor), medianOf(last, gor)
	lis := func(s sample) float64 { return s.listeners }
	l0, l1 := medianOf(first, lis), medianOf(last, lis)
	fmt.Fprintf(b, "  median of the first third -> last third: RSS %s -> %s, goroutines %.0f -> %.0f (%.0f -> %.0f of them serving health-check node ports)\n",
		mib(r0), mib(r1), g0, g1, l0, l1)
	// The health-check servers follow the services; what grows beyond
	// them would be a leak.
	g0, g1 = g0-l0, g1-l1
	if r1 > r0*(1+rssGrowth) && r1-r0 > rssGrowthBytes {
		fail("RSS grew from %s to %s over the run", mib(r0), mib(r1))
	}
	if g1 > g0*(1+goroutineGrowth) && g1-g0 > goroutineGrowthCount {
		fail("goroutines other than the health-check servers grew from %.0f to %.0f over the run", g0, g1)
	}
}

// Growth is judged on the samples after growthWarmUp (plugins compiled,
// caches filled), when they span at least growthSpan.
const (
	growthWarmUp = 2 * time.Minute
	growthSpan   = 8 * time.Minute
)

// thirds returns the first and last thirds of the samples after the
// warm-up, or nothing when they span too little time to compare.
func thirds(s []sample) (first, last []sample) {
	if len(s) == 0 {
		return nil, nil
	}
	from := s[0].at.Add(growthWarmUp)
	i := slices.IndexFunc(s, func(x sample) bool { return !x.at.Before(from) })
	if i < 0 || s[len(s)-1].at.Sub(s[i].at) < growthSpan {
		return nil, nil
	}
	s = s[i:]
	n := len(s) / 3
	return s[:n], s[len(s)-n:]
}

func span(s []sample, f func(sample) float64, format func(float64) string) string {
	lo, hi := f(s[0]), f(s[0])
	for _, x := range s {
		lo, hi = min(lo, f(x)), max(hi, f(x))
	}
	return fmt.Sprintf("%s first, %s min, %s max, %s last", format(f(s[0])), format(lo), format(hi), format(f(s[len(s)-1])))
}

func mib(v float64) string   { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }
func count(v float64) string { return fmt.Sprintf("%.0f", v) }

func medianOf(s []sample, f func(sample) float64) float64 {
	v := make([]float64, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	return median(v)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianDur(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func numCPU() int { return runtime.NumCPU() }
