package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// guestDir holds the test guests, built once per package run by TestMain;
// cacheDir is wazero's compilation cache shared by every test run.
var guestDir, cacheDir string

// guestBuilds lists the test guests and the example plugins: output name,
// package and extra flags.
var guestBuilds = []struct{ name, pkg, ldflags string }{
	{"hostile", "./testdata/guests/hostile", ""},
	{"reweight", "./testdata/guests/reweight", ""},
	{"noop", "./testdata/guests/noop", ""},
	{"raw", "./testdata/guests/raw", ""},
	{"signals", "./testdata/guests/signals", ""},
	{"abiv3", "./testdata/guests/raw", "-X main.abiVersion=3"},
	{"canary", "../plugins/canary", ""},
	{"zone-preference", "../plugins/zone-preference", ""},
	{"drain", "../plugins/drain", ""},
	{"affinity", "../plugins/affinity", ""},
	{"least-conn", "../plugins/least-conn", ""},
}

func TestMain(m *testing.M) {
	cacheDir = testCacheDir()
	if dir := os.Getenv(childGuestsEnv); dir != "" { // a child process of a test: its parent built them
		guestDir = dir
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "weir-hooks-guests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guestDir = dir
	if err := buildGuests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// testCacheDir keeps compiled guests across test runs: compiling them under
// -race takes seconds each.
func testCacheDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "weir-test", "wazero")
}

// buildGuests builds every test guest for wasip1 into guestDir.
func buildGuests() error {
	errs := make([]error, len(guestBuilds))
	var wg sync.WaitGroup
	for i, g := range guestBuilds {
		wg.Go(func() {
			args := []string{"build", "-buildmode=c-shared", "-o", guest(g.name)}
			if g.ldflags != "" {
				args = append(args, "-ldflags", g.ldflags)
			}
			cmd := exec.Command("go", append(args, g.pkg)...)
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("build test guest %s: %w\n%s", g.name, err, out)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// guest returns the path of a built test guest.
func guest(name string) string { return filepath.Join(guestDir, name+".wasm") }

// logBuffer collects a chain's logs for assertions.
type logBuffer struct{ syncbuf.Buffer }

// lines returns the log lines that contain every one of parts.
func (l *logBuffer) lines(parts ...string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if all(line, parts) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return out
}

func all(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// testLog returns a logger that records everything, printed when t fails.
func testLog(t testing.TB) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", lb.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// testTimeout replaces the default call timeout in tests: under -race on a
// loaded 2-core machine a guest's garbage collection alone can take longer
// than 100 ms. Tests about deadlines set their own.
const testTimeout = 5 * time.Second

// newChain starts a chain with the shared compilation cache and a recording
// log unless opts say otherwise, and closes it when the test ends. Plugins
// without a timeout get testTimeout.
func newChain(t testing.TB, opts Options, plugins ...Config) (*Chain, *logBuffer) {
	t.Helper()
	plugins = slices.Clone(plugins)
	for i := range plugins {
		if plugins[i].Timeout == 0 {
			plugins[i].Timeout = testTimeout
		}
	}
	var lb *logBuffer
	if opts.Log == nil {
		opts.Log, lb = testLog(t)
	}
	if opts.CacheDir == "" {
		opts.CacheDir = cacheDir
	}
	c, err := New(context.Background(), plugins, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c, lb
}

// apply runs Apply with a background context on node "node-a".
func apply(c *Chain, services []*plan.Service, full bool) ([]*plan.Service, error) {
	return c.Apply(context.Background(), node, services, full)
}

var node = plan.Node{Name: "node-a", Zone: "zone-a"}

// stats returns how many calls the named plugin's current version got and
// how many services they carried.
func stats(c *Chain, name string) (calls, sent int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		if s.Name == name && s.p != nil {
			return s.p.calls.Load(), s.p.sent.Load()
		}
	}
	return -1, -1
}

// svc returns service ns/name with n endpoints (addresses from base) and
// the given annotations (key, value pairs).
func svc(ns, name string, n int, annotations ...string) *plan.Service {
	ip := fmt.Sprintf("10.96.%d.%d", len(name)%250, len(ns)%250)
	s := sdktest.Service(ns, name, ip, 80)
	for i := range n {
		addr := netip.AddrFrom4([4]byte{10, 244, byte(len(name)), byte(i + 1)})
		s.Endpoints = append(s.Endpoints, sdktest.Endpoint(addr.String(), 8080, "node-a", "zone-a", name))
	}
	if len(annotations) > 0 {
		s.Annotations = map[string]string{}
		for i := 0; i+1 < len(annotations); i += 2 {
			s.Annotations[annotations[i]] = annotations[i+1]
		}
	}
	return s
}

// with returns a copy of s with one more annotation.
func with(s *plan.Service, key, value string) *plan.Service {
	c := s.Clone()
	c.Annotations = map[string]string{key: value}
	for k, v := range s.Annotations {
		if k != key {
			c.Annotations[k] = v
		}
	}
	return c
}

// assertSubset checks that every output service is its input's (or nil,
// for no rules) with only endpoints the input had, unchanged but for
// weight, and the same addresses and ports.
func assertSubset(t testing.TB, in, out []*plan.Service) {
	t.Helper()
	if len(in) != len(out) {
		t.Fatalf("got %d services for %d", len(out), len(in))
	}
	for i, o := range out {
		s := in[i]
		if o == nil {
			continue
		}
		if o.Key != s.Key || !slices.Equal(o.ClusterIPs, s.ClusterIPs) || o.Port != s.Port ||
			o.NodePort != s.NodePort || !slices.Equal(o.ExternalIPs, s.ExternalIPs) ||
			!slices.Equal(o.LoadBalancerIPs, s.LoadBalancerIPs) {
			t.Errorf("service %d: got %s %v:%d, sent %s %v:%d", i, o.Key, o.ClusterIPs, o.Port, s.Key, s.ClusterIPs, s.Port)
		}
		for _, e := range o.Endpoints {
			if !slices.ContainsFunc(s.Endpoints, func(x plan.Endpoint) bool {
				x.Weight = e.Weight
				return x == e
			}) {
				t.Errorf("service %s: endpoint %s was not in the input", o.Key, e.AddrPort())
			}
		}
	}
}

// weights returns a service's endpoint weights.
func weights(s *plan.Service) []uint32 {
	if s == nil {
		return nil
	}
	w := make([]uint32, len(s.Endpoints))
	for i, e := range s.Endpoints {
		w[i] = e.Weight
	}
	return w
}

// clock is a clock a test moves by hand, for quarantines and signal
// intervals; the chain reads it from its workers too.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
