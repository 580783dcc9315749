package hooks

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/weirproxy/weir/sdk/plan"
)

func reweight(name, annotation string) Config {
	return Config{Name: name, Path: guest("reweight"), Config: map[string]any{"annotation": annotation},
		FailurePolicy: PolicyClosed}
}

type change struct {
	plugin        string
	key           plan.Key
	before, after []uint32
}

// TestChainOrder shows that each plugin sees the previous one's output and
// that OnChange reports exactly the changes.
func TestChainOrder(t *testing.T) {
	var changes []change
	c, _ := newChain(t, Options{OnChange: func(plugin string, before, after *plan.Service) {
		changes = append(changes, change{plugin, before.Key, weights(before), weights(after)})
	}}, reweight("first", "w1"), reweight("second", "w2"))
	both := svc("default", "both", 2, "w1", "2", "w2", "5")
	one := svc("default", "one", 1, "w1", "2")
	none := svc("default", "none", 1)
	in := []*plan.Service{both, one, none}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	assertSubset(t, in, out)
	if !slices.Equal(weights(out[0]), []uint32{5, 5}) || !slices.Equal(weights(out[1]), []uint32{2}) || out[2] != none {
		t.Errorf("weights %v %v, none changed: %v; want [5 5] [2] and none untouched",
			weights(out[0]), weights(out[1]), out[2] != none)
	}
	want := []change{
		{"first", both.Key, []uint32{1, 1}, []uint32{2, 2}},
		{"first", one.Key, []uint32{1}, []uint32{2}},
		{"second", both.Key, []uint32{2, 2}, []uint32{5, 5}},
	}
	if !slices.EqualFunc(changes, want, func(a, b change) bool {
		return a.plugin == b.plugin && a.key == b.key && slices.Equal(a.before, b.before) && slices.Equal(a.after, b.after)
	}) {
		t.Errorf("OnChange saw %v, want %v", changes, want)
	}
}

func TestChainNoPlugins(t *testing.T) {
	c, _ := newChain(t, Options{})
	in := []*plan.Service{svc("default", "alpha", 1)}
	out, err := apply(c, in, true)
	if err != nil || out[0] != in[0] {
		t.Errorf("Apply without plugins returned %v, %v", out, err)
	}
}

// TestChainCache shows that a plugin is sent only services it has not seen
// and that an output equal to the cached one keeps its pointer, so later
// plugins are not called either.
func TestChainCache(t *testing.T) {
	c, _ := newChain(t, Options{}, reweight("reweight", "w"), Config{Name: "noop", Path: guest("noop")})
	calls := func() [4]int64 {
		rc, rs := stats(c, "reweight")
		nc, ns := stats(c, "noop")
		return [4]int64{rc, rs, nc, ns}
	}
	a, b, cc := svc("default", "a", 2, "w", "7"), svc("default", "b", 1), svc("default", "c", 1, "w", "3")
	first, err := apply(c, []*plan.Service{a, b, cc}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := calls(); got != [4]int64{1, 3, 1, 3} {
		t.Fatalf("first Apply: calls and services sent %v, want [1 3 1 3]", got)
	}

	again, err := apply(c, []*plan.Service{a, b, cc}, true)
	if err != nil || !slices.Equal(again, first) {
		t.Errorf("second Apply returned other services or %v", err)
	}
	if got := calls(); got != [4]int64{1, 3, 1, 3} {
		t.Errorf("the same services were sent again: %v", got)
	}

	b2 := with(b, "x", "y")
	out, err := apply(c, []*plan.Service{a, b2, cc}, true)
	if err != nil || out[0] != first[0] || out[2] != first[2] || out[1] != b2 {
		t.Errorf("Apply with b changed: %v, %v", out, err)
	}
	if got := calls(); got != [4]int64{2, 4, 2, 4} {
		t.Errorf("after changing b: %v, want only b sent: [2 4 2 4]", got)
	}

	// A weight reweight overrides: its output is unchanged, so noop is not called.
	a2 := a.Clone()
	a2.Endpoints[0].Weight = 4
	out, err = apply(c, []*plan.Service{a2, b2, cc}, false)
	if err != nil || out[0] != first[0] {
		t.Errorf("Apply with a's input weight changed returned a new output for a (%v)", err)
	}
	if got := calls(); got != [4]int64{3, 5, 2, 4} {
		t.Errorf("after changing a's input weight: %v, want [3 5 2 4]", got)
	}
}

// TestChainFull shows when a batch carries the Full flag.
func TestChainFull(t *testing.T) {
	c, logs := newChain(t, Options{}, Config{Name: "report", Path: guest("hostile"),
		Config: map[string]any{"mode": "report"}, Match: Match{Namespaces: []string{"mine"}}})
	reports := func() []string {
		var r []string
		for _, l := range logs.lines("plugin=report", "line=") {
			_, text, _ := strings.Cut(l, "line=")
			r = append(r, strings.Trim(text, `"`))
		}
		return r
	}
	a, b, other := svc("mine", "a", 1), svc("mine", "b", 1), svc("theirs", "c", 1)
	step := func(n plan.Node, full bool, services ...*plan.Service) {
		t.Helper()
		if _, err := c.Apply(context.Background(), n, services, full); err != nil {
			t.Fatal(err)
		}
	}
	step(node, true, a, b, other)
	step(node, true, a, b, other)
	step(node, true, a, with(b, "x", "y"), other)
	step(node, false, with(a, "x", "y"), with(b, "x", "z"))
	zoned := node
	zoned.Zone = "zone-b"
	step(zoned, true, a, b, other)
	want := []string{
		"batch services=2 full=true",  // the first sync
		"batch services=1 full=false", // one change
		"batch services=2 full=false", // not a full Apply
		"batch services=2 full=true",  // the node changed: everything is re-sent
	}
	if got := reports(); !slices.Equal(got, want) {
		t.Errorf("the plugin saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestChainForget shows that a full Apply drops the cache entries of
// services that are gone, as Forget does.
func TestChainForget(t *testing.T) {
	c, _ := newChain(t, Options{}, Config{Name: "noop", Path: guest("noop")})
	a, b := svc("default", "a", 1), svc("default", "b", 1)
	cached := func() []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		var keys []string
		for k := range c.slots[0].cache {
			keys = append(keys, k.Name)
		}
		for k := range c.lastGood {
			keys = append(keys, "good:"+k.Name)
		}
		slices.Sort(keys)
		return keys
	}
	mustApply := func(full bool, services ...*plan.Service) {
		t.Helper()
		if _, err := apply(c, services, full); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(true, a, b)
	if got := cached(); !slices.Equal(got, []string{"a", "b", "good:a", "good:b"}) {
		t.Fatalf("cached %v", got)
	}
	mustApply(false, a)
	if got := cached(); !slices.Equal(got, []string{"a", "b", "good:a", "good:b"}) {
		t.Errorf("a partial Apply dropped entries: %v", got)
	}
	mustApply(true, a)
	if got := cached(); !slices.Equal(got, []string{"a", "good:a"}) {
		t.Errorf("a full Apply without b kept %v", got)
	}
	c.Forget(a.Key)
	if got := cached(); len(got) != 0 {
		t.Errorf("Forget kept %v", got)
	}
	mustApply(false, a)
	if calls, _ := stats(c, "noop"); calls != 2 {
		t.Errorf("a forgotten service was not sent again (%d calls)", calls)
	}
}

func TestChainMatch(t *testing.T) {
	sel, err := labels.Parse("app=web")
	if err != nil {
		t.Fatal(err)
	}
	cfg := reweight("reweight", "w")
	cfg.Match = Match{Namespaces: []string{"shop", "blog"}, Selector: sel}
	c, _ := newChain(t, Options{}, cfg)
	mk := func(ns, name, app string) *plan.Service {
		s := svc(ns, name, 1, "w", "5")
		s.Labels = map[string]string{"app": app}
		return s
	}
	in := []*plan.Service{mk("shop", "web", "web"), mk("shop", "db", "db"), mk("other", "web", "web"), mk("blog", "web", "web")}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false, true} {
		if changed := out[i] != in[i]; changed != want || changed && weights(out[i])[0] != 5 {
			t.Errorf("%s: changed %v (weights %v), want %v", in[i].Key, changed, weights(out[i]), want)
		}
	}
	if _, sent := stats(c, "reweight"); sent != 2 {
		t.Errorf("sent %d services, want the 2 that match", sent)
	}
}

func TestChainMatchAnnotations(t *testing.T) {
	cfg := reweight("reweight", "w")
	cfg.Match = Match{Annotations: []string{"other", "w"}}
	c, _ := newChain(t, Options{}, cfg)
	in := []*plan.Service{svc("shop", "web", 1, "w", "5"), svc("shop", "db", 1), svc("shop", "api", 1, "x", "1")}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] == in[0] || weights(out[0])[0] != 5 || out[1] != in[1] || out[2] != in[2] {
		t.Errorf("outputs %v, want only the annotated service re-weighted", out)
	}
	if _, sent := stats(c, "reweight"); sent != 1 {
		t.Errorf("sent %d services, want only the one carrying an annotation of the list", sent)
	}
}

// TestQuarantine follows a plugin that keeps failing into quarantine, through
// a failed and a good trial call, on an injected clock.
func TestQuarantine(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	obs := &recorder{}
	c, logs := newChain(t, Options{Now: clk.Now, Observer: obs}, Config{Name: "flaky", Path: guest("hostile"),
		Config: map[string]any{"mode": "fail"}, FailurePolicy: PolicyClosed})
	alpha := svc("default", "alpha", 2)
	good, err := apply(c, []*plan.Service{alpha}, true)
	if err != nil {
		t.Fatal(err)
	}
	bad := with(alpha, actAnnotation, "true")
	step := func(s *plan.Service, wantCall bool, wantErr string) {
		t.Helper()
		before, _ := stats(c, "flaky")
		out, err := apply(c, []*plan.Service{s}, true)
		after, _ := stats(c, "flaky")
		if called := after > before; called != wantCall {
			t.Errorf("called %v, want %v", called, wantCall)
		}
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("Apply: %v", err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("Apply returned %v, want %q", err, wantErr)
		case wantErr != "" && out[0] != good[0]:
			t.Errorf("a failed service did not keep its last good output")
		case wantErr == "":
			good = out
		}
	}
	until := func(d time.Duration) string {
		return "quarantined until " + clk.Now().Add(d).Format(time.RFC3339)
	}
	for range 3 {
		step(bad, true, "refusing the batch on purpose")
	}
	step(bad, false, until(10*time.Second))
	clk.advance(10 * time.Second)
	step(bad, true, "refusing") // the failed trial doubles the backoff
	step(bad, false, until(20*time.Second))
	clk.advance(19 * time.Second)
	step(bad, false, "quarantined")
	clk.advance(time.Second)
	step(with(alpha, "round", "2"), true, "")
	step(bad, true, "refusing") // one failure after recovering is not a quarantine
	step(bad, true, "refusing")

	if n := len(logs.lines("Quarantining plugin", "plugin=flaky")); n != 2 {
		t.Errorf("logged %d quarantines, want 2 (the first and after the failed trial call)", n)
	}
	if n := len(logs.lines("Quarantining plugin again", "plugin=flaky", "backoff=20s", "failures=4")); n != 1 {
		t.Errorf("logged %d quarantines after the failed trial call with its backoff of 20s, want 1", n)
	}
	if n := len(logs.lines("Plugin recovered", "plugin=flaky")); n != 1 {
		t.Errorf("logged %d recoveries, want 1", n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.calls != 8 || obs.failures != 6 || obs.negative || strings.Join(obs.quarantine, " ") != "flaky:true flaky:true flaky:false" {
		t.Errorf("observer saw %d calls, %d failures, a negative duration %v, quarantine %q; want 8, 6, false, [flaky:true flaky:true flaky:false]",
			obs.calls, obs.failures, obs.negative, obs.quarantine)
	}
}

// TestQuarantineTrialOfSeveralCalls shows that a trial sync whose batch
// takes several calls, all failing, quarantines the plugin again once:
// one backoff doubling, one log line, one report to the Observer.
func TestQuarantineTrialOfSeveralCalls(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	obs := &recorder{}
	c, logs := newChain(t, Options{Now: func() time.Time { return now }, Observer: obs},
		Config{Name: "flaky", Path: guest("hostile"), Config: map[string]any{"mode": "fail"}})
	for i := range quarantineAfter {
		if _, err := apply(c, []*plan.Service{svc("default", fmt.Sprintf("s%d", i), 1, actAnnotation, "true")}, false); err == nil {
			t.Fatal("a failing call returned no error")
		}
	}
	now = now.Add(firstBackoff)
	big := []*plan.Service{svc("default", "big-a", 4000, actAnnotation, "true"), svc("default", "big-b", 4000, actAnnotation, "true")}
	if _, err := apply(c, big, false); strings.Count(fmt.Sprint(err), "refusing the batch") != 2 {
		t.Fatalf("the trial sync returned %v, want two failed calls", err)
	}
	again := logs.lines("Quarantining plugin again", "plugin=flaky")
	if len(again) != 1 || !strings.Contains(again[0], "backoff=20s") {
		t.Errorf("logged %q, want one quarantine with a backoff of 20s", again)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if strings.Join(obs.quarantine, " ") != "flaky:true flaky:true" {
		t.Errorf("observer saw quarantine %q, want [flaky:true flaky:true]", obs.quarantine)
	}
}

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu              sync.Mutex
	calls, failures int
	negative        bool // a duration was negative
	quarantine      []string
}

func (r *recorder) PluginCalled(plugin string, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err != nil {
		r.failures++
	}
	r.negative = r.negative || took < 0
}

func (r *recorder) PluginQuarantined(plugin string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quarantine = append(r.quarantine, fmt.Sprintf("%s:%v", plugin, on))
}

// TestHealthBackoff follows a plugin's health through twelve failed calls,
// each after the previous backoff: the third starts a quarantine and each
// failed trial call starts the next, twice as long up to 5 min. A call that
// fails while the plugin is quarantined (another call of the same sync)
// only counts.
func TestHealthBackoff(t *testing.T) {
	var h health
	now := time.Unix(0, 0)
	var got []time.Duration
	for i := range 12 {
		if started := h.failed(now); started != (i >= quarantineAfter-1) {
			t.Errorf("failure %d: started a quarantine: %v", i+1, started)
		}
		got = append(got, h.backoff)
		if h.backoff > 0 {
			now = h.until // the next failure is the trial call
		}
	}
	want := []time.Duration{0, 0, 10, 20, 40, 80, 160, 300, 300, 300, 300, 300}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Errorf("backoffs %v, want %v", got, want)
	}
	last := now.Add(-h.backoff)
	if h.failed(last.Add(time.Second)) || h.until != now || h.fails != 13 {
		t.Errorf("a failure during the quarantine changed it: until %s (want %s), %d failures", h.until, now, h.fails)
	}
	if !h.quarantined(last.Add(299*time.Second)) || h.quarantined(last.Add(300*time.Second)) {
		t.Errorf("quarantine does not end after the backoff")
	}
}

// TestChainSplit shows that a large batch goes in several calls of at most
// maxCallEndpoints endpoints, each within the default timeout, and none
// flagged Full (no single call holds every service).
func TestChainSplit(t *testing.T) {
	c, _ := newChain(t, Options{}, reweight("reweight", "w"))
	var in []*plan.Service
	for i := range 5000 {
		in = append(in, svc("default", fmt.Sprintf("svc-%d", i), 10, "w", "4"))
	}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	assertSubset(t, in, out)
	for i, s := range out {
		if w := weights(s); len(w) != 10 || w[0] != 4 || w[9] != 4 {
			t.Fatalf("service %d has weights %v, want 4s", i, w)
		}
	}
	// 5000 services of 10 endpoints count 55000 (a service counts one more).
	idx := make([]int, len(in))
	for i := range idx {
		idx[i] = i
	}
	want := int64(len(split(in, idx)))
	if calls, sent := stats(c, "reweight"); calls != want || want < 55000/maxCallEndpoints || sent != 5000 {
		t.Errorf("%d calls carried %d services, want %d calls and every service once", calls, sent, want)
	}
}

// TestChainSplitByMemory shows that a batch larger than a quarter of the
// plugin's memory is split further.
func TestChainSplitByMemory(t *testing.T) {
	cfg := reweight("reweight", "w")
	cfg.MemoryLimit = 16 << 20 // batches above 4 MiB are split
	c, _ := newChain(t, Options{}, cfg)
	big := strings.Repeat("x", 4000)
	var in []*plan.Service
	for i := range 1500 { // 1500 distinct 4 KB annotations: about 6 MB
		in = append(in, svc("default", fmt.Sprintf("svc-%d", i), 1, "w", "4", "note", big+strconv.Itoa(i)))
	}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	assertSubset(t, in, out)
	if calls, sent := stats(c, "reweight"); calls < 2 || sent != 1500 {
		t.Errorf("%d calls carried %d services, want at least 2 calls and every service once", calls, sent)
	}
}

func TestSplit(t *testing.T) {
	half := maxCallEndpoints/2 - 1 // with its own count, a service of half-1 endpoints weighs half
	services := []*plan.Service{
		svc("a", "one", half), svc("a", "two", half), svc("a", "three", 1), svc("a", "huge", 2*maxCallEndpoints), svc("a", "four", 0),
	}
	got := split(services, []int{0, 1, 2, 3, 4})
	want := [][]int{{0, 1}, {2}, {3}, {4}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("split = %v, want %v", got, want)
	}
}

// TestChainClosed shows that after Close every call fails under its policy.
func TestChainClosed(t *testing.T) {
	c, _ := newChain(t, Options{}, reweight("reweight", "w"))
	alpha := svc("default", "alpha", 1, "w", "2")
	good, err := apply(c, []*plan.Service{alpha}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, err := apply(c, []*plan.Service{with(alpha, "x", "y")}, true)
	var pe *PluginError
	if !errors.As(err, &pe) || !errors.Is(err, errClosed) || out[0] != good[0] {
		t.Errorf("Apply after Close returned %v, %v", out, err)
	}
}
