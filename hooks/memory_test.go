package hooks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// A test that measures the host's memory runs its plugin call in a child
// process of the test binary, which holds nothing else: childGuestsEnv says
// where the parent built the guests, childBombEnv what the child runs.
const (
	childGuestsEnv = "WEIRTEST_HOOKS_GUESTS"
	childBombEnv   = "WEIRTEST_HOOKS_BOMB"
	bombMarker     = "weir-bomb-result "
)

// bomb is one call that makes a plugin take memory: by default the hostile
// guest's membomb mode on one service, under a memory limit and a timeout,
// and what the call must fail with.
type bomb struct {
	Path     string        // the plugin; "" is the hostile guest in membomb mode
	Limit    uint64        // its memoryLimit
	Timeout  time.Duration // its timeout
	Services int           // services that set it off, one call each; 0 means 1
	want     string        // a regular expression the call's error matches
	bound    uint64        // how much the host's memory may grow; 0 means callBound per call
	long     bool          // skipped under -short
}

func (b bomb) String() string {
	s := fmt.Sprintf("limit=%dMi/timeout=%s", b.Limit>>20, b.Timeout)
	if b.Services > 1 {
		s += fmt.Sprintf("/calls=%d", b.Services)
	}
	return s
}

// bombResult is what the child measured around the one failing Apply.
type bombResult struct {
	Base uint64        // VmRSS before the Apply, bytes
	Peak uint64        // VmHWM after it (the peak is reset before it), bytes
	Took time.Duration // the Apply
	Err  string        // its error
}

// TestPluginMemory shows that a plugin allocating (and writing) memory in a
// loop fails as a plugin failure, that the host's memory grows during the
// call by no more than the plugin's limit plus a small overhead per call
// running at once (the bound docs/plugin-abi.md states), and that the
// call's deadline holds while the plugin's memory grows, even at 4 GiB.
func TestPluginMemory(t *testing.T) {
	bombs := []bomb{
		{Limit: 64 << 20, Timeout: 10 * time.Second, want: "out of memory"},
		{Limit: 64 << 20, Timeout: 10 * time.Second, Services: 2, want: "out of memory"},
		// Filling 1 GiB takes 7–10 s under -race on a
		// busy machine: the bound is what this one checks.
		{Limit: 1 << 30, Timeout: 10 * time.Second, want: "out of memory|timed out after 10s"},
		{Limit: 1 << 30, Timeout: 300 * time.Millisecond, want: "timed out after 300ms|out of memory"},
		// At wasm32's maximum the bound matters, not which failure comes
		// first: writing 4 GiB takes 1.9-2 s here, but more than the
		// longest timeout Check allows (10 s) on a loaded CI machine or in
		// wazero's interpreter. The deadline case stays well under the 2 s
		// an idle machine needs.
		{Limit: 4 << 30, Timeout: maxTimeout, want: "out of memory|timed out after 10s", long: true},
		{Limit: 4 << 30, Timeout: 500 * time.Millisecond, want: "timed out after 500ms", long: true},
	}
	for _, b := range bombs {
		t.Run(b.String(), func(t *testing.T) {
			if b.long && testing.Short() {
				t.Skip("a 4 GiB memory bomb is skipped under -short")
			}
			checkBomb(t, b)
		})
	}
}

// TestPluginTableBound shows that a plugin cannot make the host allocate
// through its tables either: a table declared without a maximum (as Go
// guests declare theirs) cannot grow, so a loop of table.grow (8 MiB of host
// memory per step, up to 1 GiB) fails at the first step.
func TestPluginTableBound(t *testing.T) {
	path := writeModule(t, "tablegrow", rawModule(goLikeTable, tableGrower))
	checkBomb(t, bomb{Path: path, Limit: 16 << 20, Timeout: 10 * time.Second, want: "returned status Failed"})
}

// TestPluginStack measures the one host allocation a plugin can make that
// does not depend on its memory limit: the call stack of a plugin that
// recurses until wazero's fixed ceiling stops it.
func TestPluginStack(t *testing.T) {
	recurse := []byte{0x20, 0, 0x20, 1, 0x10, 3} // weir_process(ptr, len) calls itself
	path := writeModule(t, "recurse", rawModule(nil, recurse))
	bound := uint64(stackBound)
	if raceEnabled {
		bound *= 2 // wazero keeps the stack in Go's heap, which the race detector shadows
	}
	checkBomb(t, bomb{Path: path, Limit: 16 << 20, Timeout: 10 * time.Second, want: "stack overflow", bound: bound})
}

// stackBound is how much the host's memory may grow for the call stack of
// one call (docs/plugin-abi.md): wazero v1.12 fails a call whose stack
// would grow beyond 50 MB, and the stack doubles as it grows, so at that
// moment the host holds the last two stacks, about 150 MB.
const stackBound = 192 << 20

// TestPluginInstances shows the count the memory bound of
// docs/plugin-abi.md rests on: however many calls a sync makes at once, and
// though every failed call replaces its instance, a plugin never has more
// than max(maxIdle, maxWorkers) instances' memory reserved at a time.
func TestPluginInstances(t *testing.T) {
	bound := int64(max(maxIdle, maxWorkers))
	if bound != 2 {
		t.Errorf("a plugin may have %d instances; docs/plugin-abi.md says two", bound)
	}
	var services []*plan.Service // of 1000 endpoints each: ten calls
	var keys []plan.Key
	for i := range 40 {
		services = append(services, svc("default", fmt.Sprintf("s%d", i), 1000, "w", "2", actAnnotation, "true"))
		keys = append(keys, services[i].Key)
	}
	for _, cfg := range []Config{reweight("reweight", "w"), {Name: "fail", Path: guest("hostile"), Config: map[string]any{"mode": "fail"}}} {
		t.Run(cfg.Name, func(t *testing.T) {
			c, _ := newChain(t, Options{}, cfg)
			for range 3 {
				c.Forget(keys...)
				_, _ = apply(c, services, true)
			}
			if calls, _ := stats(c, cfg.Name); calls < 10 {
				t.Fatalf("the plugin got %d calls, want at least 10", calls)
			}
			p := c.slots[0].p
			if peak, live := p.memories.peak.Load(), p.memories.live.Load(); peak > bound || live > int64(maxIdle) {
				t.Errorf("%d instances' memory reserved at the peak (bound %d), %d after the syncs (bound %d)",
					peak, bound, live, maxIdle)
			}
		})
	}
}

// checkBomb runs b in a child process and checks what it measured.
func checkBomb(t *testing.T, b bomb) {
	t.Helper()
	r := runBomb(t, b)
	grown := r.Peak - min(r.Base, r.Peak)
	t.Logf("host memory %d MiB before the Apply, peak %d MiB (+%d MiB); it took %s",
		r.Base>>20, r.Peak>>20, grown>>20, r.Took.Round(time.Millisecond))
	calls := max(b.Services, 1)
	if n := strings.Count(r.Err, `plugin "bomb" failed on 1 service`); n != calls || !regexp.MustCompile(b.want).MatchString(r.Err) {
		t.Errorf("Apply returned %q, want %d plugin failures with %q", r.Err, calls, b.want)
	}
	bound := b.bound
	if bound == 0 {
		bound = uint64(calls) * callBound(b.Limit)
	}
	if grown > bound {
		t.Errorf("the host's memory grew by %d MiB during the Apply, more than the bound of %d MiB for %d calls at a limit of %d MiB",
			grown>>20, bound>>20, calls, b.Limit>>20)
	}
	if r.Took > b.Timeout+deadlineMargin {
		t.Errorf("the Apply took %s; the timeout is %s (margin %s)", r.Took, b.Timeout, deadlineMargin)
	}
}

// callBound is how much the host's memory may grow during one call of a
// plugin whose memory limit is limit: the instance's memory, which is
// never copied, plus a 16th and 16 MiB of slack for the host's side of the
// call and the Go runtime's heap growth (the memory alone comes within
// 20 MiB of limit at 1 GiB).
func callBound(limit uint64) uint64 { return limit + limit/16 + 16<<20 }

// deadlineMargin is how much later than its timeout a call may end, under
// -race on a loaded two-core machine.
const deadlineMargin = time.Second

// runBomb runs one bomb in a child process and returns what it measured.
func runBomb(t *testing.T, b bomb) bombResult {
	t.Helper()
	spec, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryBombChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childGuestsEnv+"="+guestDir, childBombEnv+"="+string(spec))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(line, bombMarker); ok {
			var r bombResult
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatalf("child process result %q: %v", rest, err)
			}
			return r
		}
	}
	t.Fatalf("the child process printed no result:\n%s", out)
	return bombResult{}
}

// TestMemoryBombChild is the child process of runBomb: it loads the bomb,
// checks that a harmless call works, resets the process's peak memory and
// makes the Apply that sets the bomb off. Services that set it off have
// 4000 endpoints each, so that each goes in a call of its own.
func TestMemoryBombChild(t *testing.T) {
	spec := os.Getenv(childBombEnv)
	if spec == "" {
		t.Skip("runs only as a child process of TestPluginMemory")
	}
	var b bomb
	if err := json.Unmarshal([]byte(spec), &b); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "bomb", Path: b.Path, MemoryLimit: b.Limit, Timeout: b.Timeout}
	if cfg.Path == "" {
		cfg.Path, cfg.Config = guest("hostile"), map[string]any{"mode": "membomb"}
	}
	c, _ := newChain(t, Options{}, cfg)
	if _, err := apply(c, []*plan.Service{svc("default", "alpha", 3)}, true); err != nil && b.Path == "" {
		t.Fatalf("harmless call: %v", err)
	}
	var bombs []*plan.Service
	for i := range max(b.Services, 1) {
		bombs = append(bombs, svc("default", fmt.Sprintf("bomb-%d", i), 4000, actAnnotation, "true"))
	}
	runtime.GC()
	debug.FreeOSMemory()
	base, err := resetPeak()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = apply(c, bombs, true)
	r := bombResult{Base: base, Took: time.Since(start), Err: fmt.Sprint(err)}
	if r.Peak, err = procStatus("VmHWM"); err != nil {
		t.Fatal(err)
	}
	line, _ := json.Marshal(r)
	fmt.Printf("%s%s\n", bombMarker, line)
}

// resetPeak resets the process's peak resident memory (VmHWM) to its
// current resident memory and returns that.
func resetPeak() (uint64, error) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset the peak resident memory: %w", err)
	}
	return procStatus("VmRSS")
}

// procStatus reads one memory figure of /proc/self/status, in bytes.
func procStatus(key string) (uint64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", key)
}
