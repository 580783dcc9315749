package compare

import (
	"fmt"
	"strings"
	"time"
)

// column is one measure of the table: its heading, the phase that takes
// it (for "> cap") and how to read it from a result.
type column struct {
	head  string
	phase string
	// value is the figure, ok false when there is none; timed columns
	// compare against the cap.
	value func(r *Result) (float64, bool)
	show  func(v float64) string
	timed bool
}

// phases in the order a run takes them; a capped run has every measure of
// its phase and later ones missing.
var phases = []string{"setup", "first sync", "one change", "churn", "settling after the churn", "kernel objects"}

func durationColumn(head, phase string, get func(r *Result) time.Duration) column {
	return column{head: head, phase: phase, timed: true, show: showSeconds,
		value: func(r *Result) (float64, bool) { d := get(r); return d.Seconds(), d > 0 }}
}

func quantileColumn(head, phase string, q float64, get func(r *Result) []time.Duration) column {
	return durationColumn(head, phase, func(r *Result) time.Duration { return quantile(get(r), q) })
}

func bytesColumn(head, phase string, get func(r *Result) int64) column {
	return column{head: head, phase: phase, show: showMiB,
		value: func(r *Result) (float64, bool) { b := get(r); return float64(b), b > 0 }}
}

func countColumn(head string, get func(c *Counts) int) column {
	return column{head: head, phase: "kernel objects", show: func(v float64) string { return fmt.Sprintf("%.0f", v) },
		value: func(r *Result) (float64, bool) {
			if r.Kernel == nil {
				return 0, false
			}
			return float64(get(r.Kernel)), true
		}}
}

func changes(r *Result) []time.Duration { return r.Changes }
func churn(r *Result) []time.Duration   { return r.Churn }

// columns are the table's measures.
var columns = []column{
	durationColumn("start → first sync", "first sync", func(r *Result) time.Duration { return r.FirstSync }),
	durationColumn("its full sync", "first sync", func(r *Result) time.Duration { return r.FullSync }),
	quantileColumn("one change, median", "one change", 0.5, changes),
	quantileColumn("one change, max", "one change", 1, changes),
	quantileColumn("churn p50", "churn", 0.5, churn),
	quantileColumn("churn p99", "churn", 0.99, churn),
	quantileColumn("churn max", "churn", 1, churn),
	bytesColumn("peak RSS", "settling after the churn", func(r *Result) int64 { return r.PeakRSS }),
	bytesColumn("steady RSS", "settling after the churn", func(r *Result) int64 { return r.SteadyRSS }),
	{head: "CPU", phase: "settling after the churn", show: showSeconds,
		value: func(r *Result) (float64, bool) { return r.CPUTotal.Seconds(), r.CPUTotal > 0 }},
	{head: "CPU in churn", phase: "settling after the churn", show: showSeconds,
		value: func(r *Result) (float64, bool) { return r.CPUChurn.Seconds(), r.CPUChurn > 0 }},
	countColumn("rules", func(c *Counts) int { return c.Rules }),
	countColumn("chains", func(c *Counts) int { return c.Chains }),
	countColumn("set elements", func(c *Counts) int { return c.Elements }),
}

// Markdown is the side-by-side table, with header (machine, date,
// command) above it and the notes on loads and runs below.
func (rep *Report) Markdown(header string, capDur time.Duration) string {
	var b strings.Builder
	if header != "" {
		b.WriteString(header + "\n\n")
	}
	heads := []string{"services × endpoints", "minSyncPeriod", "mode", "proxy"}
	for _, c := range columns {
		heads = append(heads, c.head)
	}
	b.WriteString("| " + strings.Join(heads, " | ") + " |\n")
	b.WriteString(strings.Repeat("| --- ", len(heads)) + "|\n")
	for _, g := range rep.groups() {
		for _, row := range g.rows(capDur) {
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
	}
	b.WriteString(rep.notes())
	return b.String()
}

// group is the results of one size, setting and mode: kube-proxy's and
// Weir's, either possibly missing.
type group struct {
	kp, weir *Result
}

// groups pairs the results in the order they ran.
func (rep *Report) groups() []group {
	var out []group
	index := map[string]int{}
	for i := range rep.Results {
		r := &rep.Results[i]
		key := fmt.Sprintf("%s/%v/%s", r.Size, r.MinSync, r.Target.Mode)
		j, ok := index[key]
		if !ok {
			j = len(out)
			index[key] = j
			out = append(out, group{})
		}
		if r.Target.Proxy == KubeProxy {
			out[j].kp = r
		} else {
			out[j].weir = r
		}
	}
	return out
}

// rows are a group's table rows: each proxy's, then the ratio when both ran.
func (g group) rows(capDur time.Duration) [][]string {
	var rows [][]string
	first := g.kp
	if first == nil {
		first = g.weir
	}
	key := []string{first.Size.label(), first.MinSync.String(), first.Target.Mode}
	blank := []string{"", "", ""}
	for _, r := range []*Result{g.kp, g.weir} {
		if r == nil {
			continue
		}
		row := append(append([]string{}, key...), proxyName(r.Target.Proxy))
		for _, c := range columns {
			row = append(row, cell(r, c))
		}
		rows = append(rows, row)
		key = blank
	}
	if g.kp != nil && g.weir != nil {
		row := append(append([]string{}, key...), "Weir / kube-proxy")
		for _, c := range columns {
			row = append(row, ratio(g.kp, g.weir, c, capDur))
		}
		rows = append(rows, row)
	}
	return rows
}

func proxyName(p string) string {
	if p == Weir {
		return "Weir"
	}
	return p
}

// cell is one figure of r, "> cap" when the cap cut it off, "–" when it
// is missing otherwise.
func cell(r *Result, c column) string {
	if v, ok := c.value(r); ok {
		if r.Capped != "" && !c.timed {
			return c.show(v) + " at cap"
		}
		return c.show(v)
	}
	if cutOff(r, c) {
		return "> cap"
	}
	return "–"
}

// cutOff reports whether the cap stopped r before column c was measured.
func cutOff(r *Result, c column) bool {
	if r.Capped == "" || !c.timed {
		return false
	}
	return phaseIndex(c.phase) >= phaseIndex(r.Capped)
}

func phaseIndex(p string) int {
	for i, q := range phases {
		if q == p {
			return i
		}
	}
	return len(phases)
}

// ratio is Weir's figure over kube-proxy's; when kube-proxy passed the
// cap on a timed measure Weir finished, an upper bound (Weir over the cap).
func ratio(kp, weir *Result, c column, capDur time.Duration) string {
	w, wok := c.value(weir)
	k, kok := c.value(kp)
	partial := func(r *Result) bool { return r.Capped != "" && !c.timed } // a reading at the cap
	switch {
	case wok && kok && k > 0 && !partial(kp) && !partial(weir):
		return showRatio(w / k)
	case wok && c.timed && cutOff(kp, c) && capDur > 0:
		return "< " + showRatio(max(w/capDur.Seconds(), 0.001))
	}
	return "–"
}

func showRatio(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2g", r)
}

// showSeconds formats seconds with three significant digits: "0.42 ms",
// "12.1 ms", "540 ms", "16.2 s", "13.2 min".
func showSeconds(s float64) string {
	switch {
	case s < 0.001:
		return fmt.Sprintf("%.2g ms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.3g ms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.3g s", s)
	}
	return fmt.Sprintf("%.1f min", s/60)
}

func showMiB(b float64) string { return fmt.Sprintf("%.0f MiB", b/(1<<20)) }

// legend says how each column is measured.
const legend = `
How each figure is taken, the same way for both proxies, each in a fresh
node network namespace against the same API server: *start → first sync*
from the process's start until a connection from a client namespace to a
probe service's cluster IP is answered by its pod through the proxy's
rules; *its full sync* is the proxy's own
kubeproxy_sync_full_proxy_rules_duration_seconds for that sync; *one
change* and *churn* from the API write of a probe service's EndpointSlice
until a connection is answered by the new endpoint (one change at a time,
at least minSyncPeriod after the last sync; the churn writes at a steady
rate, every other write a probe); RSS from /proc (peak: VmHWM; steady:
VmRSS once the churn has settled); CPU is utime+stime of the process and
of its children (nft, iptables-restore); rules, chains and set elements
are counted with nft -j list ruleset and iptables-legacy-save after the
proxy stopped.
`

// notes are the lines under the table: the legend, the loads, then what
// each run skipped, failed, or remarked.
func (rep *Report) notes() string {
	var b strings.Builder
	b.WriteString(legend + "\n")
	if rep.zeroKubeProxy() {
		b.WriteString("- kube-proxy's minSyncPeriod 0 is written as 1ns: its configuration turns 0 into the default 1s " +
			"(pkg/proxy/apis/config/v1alpha1/defaults.go), and with --config it ignores --iptables-min-sync-period.\n")
	}
	for _, l := range rep.Loads {
		fmt.Fprintf(&b, "- Load %s: %d API writes in %s (%.0f/s): %d services created, %d hidden, %d shown again, %d slices rewritten.\n",
			l.Size.label(), l.Writes, showSeconds(l.Took.Seconds()), float64(l.Writes)/max(l.Took.Seconds(), 1e-9),
			l.Created, l.Hidden, l.Shown, l.Rewritten)
	}
	for i := range rep.Results {
		for _, n := range rep.Results[i].notes() {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}

// zeroKubeProxy reports whether kube-proxy ran with minSyncPeriod 0.
func (rep *Report) zeroKubeProxy() bool {
	for _, r := range rep.Results {
		if r.Target.Proxy == KubeProxy && r.MinSync == 0 && r.Skipped == "" {
			return true
		}
	}
	return false
}

// notes are the remarks on one run.
func (r *Result) notes() []string {
	who := fmt.Sprintf("%s, %s, %s, minSyncPeriod %v", proxyName(r.Target.Proxy), r.Target.Mode, r.Size.label(), r.MinSync)
	var out []string
	switch {
	case r.Skipped != "":
		return []string{fmt.Sprintf("%s: not run: %s.", who, r.Skipped)}
	case r.Failed != "":
		out = append(out, fmt.Sprintf("%s: **failed**: %s.", who, r.Failed))
	case r.Capped != "":
		out = append(out, fmt.Sprintf("%s: passed the cap during %s; killed.", who, r.Capped))
	}
	if r.ChildPeakRSS > 0 {
		out = append(out, fmt.Sprintf("%s: its largest child process (nft, iptables-restore) peaked at %s or more, besides its own RSS.",
			who, showMiB(float64(r.ChildPeakRSS))))
	}
	if r.ChurnBusy > 0 {
		out = append(out, fmt.Sprintf("%s: %d churn writes moved a load endpoint instead of a probe: every probe service had %d writes being measured.",
			who, r.ChurnBusy, maxPending))
	}
	if want := r.ChurnRate * r.ChurnFor.Seconds(); r.ChurnWrites > 0 && float64(r.ChurnWrites) < 0.95*want {
		out = append(out, fmt.Sprintf("%s: the churn wrote %d times in %s, not %.0f: %.1f/s instead of %g/s.",
			who, r.ChurnWrites, showSeconds(r.ChurnFor.Seconds()), want, float64(r.ChurnWrites)/r.ChurnFor.Seconds(), r.ChurnRate))
	}
	if r.ChurnLate > 0 {
		out = append(out, fmt.Sprintf("%s: %d churn writes left out: %d earlier ones still waited for the API server.",
			who, r.ChurnLate, maxOutstanding))
	}
	if r.Target.Mode == "ipvs" && r.Kernel != nil {
		out = append(out, fmt.Sprintf("%s: kernel objects are its iptables and nftables ones only: IPVS virtual servers and ipset members are not counted.", who))
	}
	if r.KernelErr != "" {
		out = append(out, fmt.Sprintf("%s: kernel objects not counted: %s.", who, r.KernelErr))
	}
	for _, n := range r.Notes {
		out = append(out, fmt.Sprintf("%s: %s.", who, n))
	}
	return out
}
