package difftest

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Result is one seed in one mode: every probe's outcome in each run, and
// the probes on which the runs disagree.
type Result struct {
	Seed     int64
	Mode     string
	Scenario *Scenario
	Probes   []Probe
	// Outcomes holds each run's outcomes by probe ID: "kube-proxy",
	// "weir" and "kube-proxy again".
	Outcomes map[string]map[string]Outcome
	// Noise are the probes on which kube-proxy disagreed with itself;
	// Other is then its second run's outcome.
	Noise []Disagreement
	// Diffs are the probes, noise left out, on which Weir disagreed with
	// kube-proxy in a way no deliberate difference explains.
	Diffs []Disagreement
	// Deliberate are the probes on which Weir differs on purpose, each
	// with the reason docs/semantics.md gives.
	Deliberate []Disagreement
}

// Disagreement is one probe with two outcomes.
type Disagreement struct {
	Probe     Probe
	KubeProxy Outcome
	Other     Outcome
	// Why, for a deliberate difference, names it.
	Why string
}

// Agrees reports whether Weir agreed with kube-proxy on every probe and
// kube-proxy with itself.
func (r *Result) Agrees() bool { return len(r.Noise) == 0 && len(r.Diffs) == 0 }

// judge compares the runs probe by probe.
func judge(sc *Scenario, mode string, probes []Probe, runs map[string]map[string]Outcome) *Result {
	r := &Result{Seed: sc.Seed, Mode: mode, Scenario: sc, Probes: probes, Outcomes: runs}
	for _, p := range probes {
		kp, weir, again := runs[runKubeProxy][p.ID], runs[runWeir][p.ID], runs[runAgain][p.ID]
		switch {
		case kp.String() != again.String():
			r.Noise = append(r.Noise, Disagreement{Probe: p, KubeProxy: kp, Other: again})
		case kp.String() == weir.String():
		default:
			d := Disagreement{Probe: p, KubeProxy: kp, Other: weir, Why: deliberate(sc, p, kp, weir)}
			if d.Why == "" {
				r.Diffs = append(r.Diffs, d)
			} else {
				r.Deliberate = append(r.Deliberate, d)
			}
		}
	}
	return r
}

// Summary is one line about the result.
func (r *Result) Summary() string {
	return fmt.Sprintf("seed %d, %s: %d services, %d probes; kube-proxy against itself: %d differ; Weir against kube-proxy: %d differ, %d on purpose",
		r.Seed, r.Mode, len(r.Scenario.Services), len(r.Probes), len(r.Noise), len(r.Diffs), len(r.Deliberate))
}

// Report describes every disagreement, and for each service involved its
// objects, so that a difference can become a conformance row.
func (r *Result) Report() string {
	var b strings.Builder
	b.WriteString(r.Summary() + "\n")
	section := func(title, other string, ds []Disagreement) {
		if len(ds) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, d := range ds {
			fmt.Fprintf(&b, "  %s\n    kube-proxy: %s\n    %s: %s\n", d.Probe.ID, withExample(d.KubeProxy), other, withExample(d.Other))
			if d.Why != "" {
				fmt.Fprintf(&b, "    on purpose: %s\n", d.Why)
			}
		}
	}
	section("kube-proxy disagrees with itself (noise)", "kube-proxy again", r.Noise)
	section("Weir disagrees with kube-proxy", "weir", r.Diffs)
	section("Weir differs on purpose", "weir", r.Deliberate)
	var names []string
	for _, d := range append(slices.Clone(r.Noise), r.Diffs...) {
		if name, _, _ := strings.Cut(d.Probe.Service, ":"); name != "" && !slices.Contains(names, name) {
			names = append(names, strings.TrimSuffix(name, " health"))
		}
	}
	if len(names) > 0 {
		fmt.Fprintf(&b, "\nthe objects (seed %d):\n%s", r.Seed, r.Scenario.Manifests(names...))
	}
	return b.String()
}

func withExample(o Outcome) string {
	if o.Example == "" {
		return o.String()
	}
	return fmt.Sprintf("%s (%s)", o, o.Example)
}

// Table is a markdown table of results, one row per seed and mode, with
// totals, the command that produced it and how long it took.
func Table(results []*Result, command string, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s` (%v)\n\n", command, took.Round(time.Second))
	b.WriteString("| seed | mode | services | probes | kube-proxy against itself | Weir against kube-proxy | on purpose |\n")
	b.WriteString("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	var probes, noise, diffs, deliberate int
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %s | %d | %d | %d | %d | %d |\n", r.Seed, r.Mode, len(r.Scenario.Services),
			len(r.Probes), len(r.Noise), len(r.Diffs), len(r.Deliberate))
		probes, noise, diffs, deliberate = probes+len(r.Probes), noise+len(r.Noise), diffs+len(r.Diffs), deliberate+len(r.Deliberate)
	}
	fmt.Fprintf(&b, "| all | | | %d | %d | %d | %d |\n", probes, noise, diffs, deliberate)
	return b.String()
}
