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

// bomb is one memory bomb: the hostile guest's membomb mode under a memory
// limit and a timeout, and what the call must fail with.
type bomb struct {
	limit   uint64
	timeout time.Duration
	want    string // a regular expression the call's error matches
	long    bool   // skipped under -short
}

func (b bomb) String() string {
	return fmt.Sprintf("limit=%dMi/timeout=%s", b.limit>>20, b.timeout)
}

// bombResult is what the child measured around the one failing call.
type bombResult struct {
	Base uint64        // VmRSS before the call, bytes
	Peak uint64        // VmHWM after the call (the peak is reset before it), bytes
	Took time.Duration // the call
	Err  string        // Apply's error
}

// TestPluginMemory shows that a plugin allocating (and writing) memory in a
// loop fails as a plugin failure, that the host's memory grows during the
// call by no more than the plugin's limit plus a small overhead (the bound
// docs/plugin-abi.md states), and that the call's deadline holds while the
// plugin's memory grows, even at large limits.
func TestPluginMemory(t *testing.T) {
	bombs := []bomb{
		{limit: 64 << 20, timeout: 10 * time.Second, want: "out of memory"},
		{limit: 1 << 30, timeout: 10 * time.Second, want: "out of memory"},
		{limit: 1 << 30, timeout: 300 * time.Millisecond, want: "timed out after 300ms|out of memory"},
		{limit: 4 << 30, timeout: 30 * time.Second, want: "out of memory", long: true},
		{limit: 4 << 30, timeout: 2 * time.Second, want: "timed out after 2s", long: true},
	}
	for _, b := range bombs {
		t.Run(b.String(), func(t *testing.T) {
			if b.long && testing.Short() {
				t.Skip("a 4 GiB memory bomb is skipped under -short")
			}
			r := runBomb(t, b)
			t.Logf("host memory %d MiB before the call, peak %d MiB (+%d MiB); the call took %s",
				r.Base>>20, r.Peak>>20, (r.Peak-min(r.Base, r.Peak))>>20, r.Took.Round(time.Millisecond))
			if !strings.Contains(r.Err, `plugin "bomb" failed on 1 service`) || !regexp.MustCompile(b.want).MatchString(r.Err) {
				t.Errorf("Apply returned %q, want a plugin failure with %q", r.Err, b.want)
			}
			if grown, bound := r.Peak-min(r.Base, r.Peak), callBound(b.limit); grown > bound {
				t.Errorf("the host's memory grew by %d MiB during the call, more than the bound of %d MiB for a limit of %d MiB",
					grown>>20, bound>>20, b.limit>>20)
			}
			if margin := deadlineMargin; r.Took > b.timeout+margin {
				t.Errorf("the call took %s; its timeout is %s (margin %s)", r.Took, b.timeout, margin)
			}
		})
	}
}

// callBound is how much the host's memory may grow during one call of a
// plugin whose memory limit is limit: the instance's memory, which is
// never copied, plus 16 MiB for the host's side of the call and the Go
// runtime's heap growth.
func callBound(limit uint64) uint64 { return limit + 16<<20 }

// deadlineMargin is how much later than its timeout a call may end, under
// -race on a loaded two-core machine.
const deadlineMargin = time.Second

// runBomb runs one memory bomb in a child process and returns what it measured.
func runBomb(t *testing.T, b bomb) bombResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryBombChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childGuestsEnv+"="+guestDir,
		fmt.Sprintf("%s=%d,%s", childBombEnv, b.limit, b.timeout))
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
// makes the call that sets the bomb off.
func TestMemoryBombChild(t *testing.T) {
	spec := os.Getenv(childBombEnv)
	if spec == "" {
		t.Skip("runs only as a child process of TestPluginMemory")
	}
	limitText, timeoutText, _ := strings.Cut(spec, ",")
	limit, err := strconv.ParseUint(limitText, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	timeout, err := time.ParseDuration(timeoutText)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newChain(t, Options{}, Config{Name: "bomb", Path: guest("hostile"),
		Config: map[string]any{"mode": "membomb"}, MemoryLimit: limit, Timeout: timeout})
	alpha := svc("default", "alpha", 3)
	if _, err := apply(c, []*plan.Service{alpha}, true); err != nil {
		t.Fatalf("harmless call: %v", err)
	}
	runtime.GC()
	debug.FreeOSMemory()
	base, err := resetPeak()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = apply(c, []*plan.Service{with(alpha, actAnnotation, "true")}, true)
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
