package compare

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Size is one generated cluster: Services services of test/scale's mix,
// each with one EndpointSlice of Endpoints endpoints.
type Size struct {
	Services, Endpoints int
}

// String is the size as the flags and the table write it, "10000x10".
func (s Size) String() string { return fmt.Sprintf("%dx%d", s.Services, s.Endpoints) }

// label is the size as the table shows it, "10000 × 10".
func (s Size) label() string { return fmt.Sprintf("%d × %d", s.Services, s.Endpoints) }

// total is the number of endpoints in the cluster.
func (s Size) total() int { return s.Services * s.Endpoints }

// The limits a size must respect: the API server's service range (a /16,
// less the probe services and the kubernetes Service) and its limit of
// 1000 endpoints in one EndpointSlice.
const (
	maxServices  = 60000
	maxEndpoints = 1000
)

// ParseSizes reads a comma-separated list of sizes such as
// "1000x10,10000x10,5000x50".
func ParseSizes(text string) ([]Size, error) {
	var out []Size
	for _, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		s, err := parseSize(item)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, s) {
			return nil, fmt.Errorf("size %s listed twice", s)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseSize(item string) (Size, error) {
	a, b, ok := strings.Cut(strings.ReplaceAll(item, "×", "x"), "x")
	if !ok {
		return Size{}, fmt.Errorf("size %q: want SERVICESxENDPOINTS, such as 10000x10", item)
	}
	n, err1 := strconv.Atoi(strings.TrimSpace(a))
	e, err2 := strconv.Atoi(strings.TrimSpace(b))
	switch {
	case err1 != nil || err2 != nil:
		return Size{}, fmt.Errorf("size %q: want SERVICESxENDPOINTS, two whole numbers such as 10000x10", item)
	case n < 1 || n > maxServices:
		return Size{}, fmt.Errorf("size %q: services must be between 1 and %d (the service range)", item, maxServices)
	case e < 1 || e > maxEndpoints:
		return Size{}, fmt.Errorf("size %q: endpoints must be between 1 and %d (one EndpointSlice)", item, maxEndpoints)
	}
	return Size{Services: n, Endpoints: e}, nil
}

// The proxies a run compares.
const (
	KubeProxy = "kube-proxy"
	Weir      = "weir"
)

// Modes are the modes a run knows, in the order the table shows them.
var Modes = []string{"nftables", "iptables-nft", "iptables-legacy", "ipvs"}

// Target is one proxy in one mode.
type Target struct {
	// Proxy is KubeProxy or Weir.
	Proxy string
	// Mode is one of Modes.
	Mode string
}

// String names the target, "kube-proxy nftables".
func (t Target) String() string { return t.Proxy + " " + t.Mode }

// kernelMode is the mode as the proxy's configuration spells it.
func (t Target) kernelMode() string {
	m, _, _ := strings.Cut(t.Mode, "-")
	return m
}

// flavour is the iptables flavour of an iptables mode, or "".
func (t Target) flavour() string {
	_, f, _ := strings.Cut(t.Mode, "-")
	return f
}

// ParseList reads a comma-separated list whose items must be in allowed;
// what names the list in errors.
func ParseList(text, what string, allowed []string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !slices.Contains(allowed, item) {
			return nil, fmt.Errorf("%s %q: want one of %s", what, item, strings.Join(allowed, ", "))
		}
		if slices.Contains(out, item) {
			return nil, fmt.Errorf("%s %q listed twice", what, item)
		}
		out = append(out, item)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s given: want one or more of %s", what, strings.Join(allowed, ", "))
	}
	return out, nil
}

// Config is what one comparison runs.
type Config struct {
	// Weir and KubeProxy are the binaries.
	Weir, KubeProxy string
	// Sizes are the clusters, run from the fewest endpoints up.
	Sizes []Size
	// Proxies are the proxies to run: KubeProxy, Weir or both.
	Proxies []string
	// Modes are the modes to run, each of Modes; kube-proxy has no ipvs
	// row here (kube-proxy's IPVS mode is not compared).
	Modes []string
	// MinSyncPeriod and SyncPeriod are both proxies' settings.
	MinSyncPeriod, SyncPeriod time.Duration
	// ZeroSizes are the sizes at which every target runs once more with
	// minSyncPeriod 0; each must be one of Sizes.
	ZeroSizes []Size
	// Changes is how many one-endpoint changes are timed one at a time.
	Changes int
	// ChurnRate is the EndpointSlice updates per second of the churn
	// phase, ChurnDuration how long it writes.
	ChurnRate     float64
	ChurnDuration time.Duration
	// ProbeServices is the number of services whose single endpoint is a
	// real pod, flipped between two pods to see a change in the kernel.
	ProbeServices int
	// Cap bounds each run (one target, size and setting); a run that
	// passes it is killed and its missing measures read "> cap".
	Cap time.Duration
	// Writers is the number of parallel writers that load the objects.
	Writers int
	// Dir holds each run's logs.
	Dir string
	// Log receives progress lines.
	Log io.Writer
}

// Defaults are the figures the issue asks for.
func Defaults() Config {
	return Config{
		Sizes:         []Size{{1000, 10}, {10000, 10}, {5000, 50}, {30000, 10}},
		Proxies:       []string{KubeProxy, Weir},
		Modes:         slices.Clone(Modes),
		MinSyncPeriod: time.Second,
		SyncPeriod:    30 * time.Second,
		ZeroSizes:     []Size{{10000, 10}},
		Changes:       7,
		ChurnRate:     20,
		ChurnDuration: time.Minute,
		ProbeServices: 50,
		Cap:           20 * time.Minute,
		Writers:       16,
	}
}

// Validate says what is wrong with c, every problem at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Sizes) == 0 {
		bad("no sizes given")
	}
	for _, z := range c.ZeroSizes {
		if !slices.Contains(c.Sizes, z) {
			bad("minSyncPeriod-0 size %s is not one of the sizes run", z)
		}
	}
	if c.MinSyncPeriod < 0 || c.SyncPeriod <= 0 || c.MinSyncPeriod > c.SyncPeriod {
		bad("sync periods %v and %v: want 0 <= minSyncPeriod <= syncPeriod and syncPeriod > 0", c.MinSyncPeriod, c.SyncPeriod)
	}
	if c.Changes < 1 {
		bad("changes %d: want at least 1", c.Changes)
	}
	if c.ChurnRate <= 0 || c.ChurnRate > 1000 || c.ChurnDuration <= 0 {
		bad("churn %g/s for %v: want a rate in (0, 1000] and a positive duration", c.ChurnRate, c.ChurnDuration)
	}
	if c.ProbeServices < 2 || c.ProbeServices > 1000 {
		bad("probe services %d: want 2 to 1000", c.ProbeServices)
	}
	if c.Cap < 10*time.Second {
		bad("cap %v: want at least 10s", c.Cap)
	}
	if c.Writers < 1 || c.Writers > 256 {
		bad("writers %d: want 1 to 256", c.Writers)
	}
	if slices.Contains(c.Proxies, Weir) && c.Weir == "" {
		bad("no weir binary given")
	}
	if slices.Contains(c.Proxies, KubeProxy) && c.KubeProxy == "" {
		bad("no kube-proxy binary given")
	}
	if len(c.Proxies) == 0 || len(c.Modes) == 0 {
		bad("no proxies or no modes given")
	}
	if c.Dir == "" {
		bad("no folder for the logs given")
	}
	return errors.Join(errs...)
}

// targets are the targets of one mode, kube-proxy first.
func (c *Config) targets(mode string) []Target {
	var out []Target
	for _, p := range []string{KubeProxy, Weir} {
		if slices.Contains(c.Proxies, p) && (p == Weir || mode != "ipvs") {
			out = append(out, Target{Proxy: p, Mode: mode})
		}
	}
	return out
}

// settings are the minSyncPeriods size runs with: the configured one,
// then 0 when size is one of ZeroSizes and the configured one is not 0.
func (c *Config) settings(size Size) []time.Duration {
	out := []time.Duration{c.MinSyncPeriod}
	if c.MinSyncPeriod != 0 && slices.Contains(c.ZeroSizes, size) {
		out = append(out, 0)
	}
	return out
}

// orderedSizes are the sizes from the fewest endpoints up (then the fewest
// services), so that a target that passes the cap at one size can be
// skipped at the larger ones.
func (c *Config) orderedSizes() []Size {
	out := slices.Clone(c.Sizes)
	slices.SortStableFunc(out, func(a, b Size) int {
		if d := a.total() - b.total(); d != 0 {
			return d
		}
		return a.Services - b.Services
	})
	return out
}
