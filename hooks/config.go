package hooks

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/weirproxy/weir/sdk/plan"
)

// Policy says what the services of a batch get when their plugin fails on it.
type Policy string

// The failure policies.
const (
	// PolicyOpen passes the plugin's input through unchanged.
	PolicyOpen Policy = "open"
	// PolicyClosed gives the services their last good chain output (or no
	// rules) and skips the rest of the chain for them.
	PolicyClosed Policy = "closed"
)

// Match selects the services a plugin sees; the others pass it unsent.
type Match struct {
	// Namespaces lists the namespaces whose services match; empty matches all.
	Namespaces []string
	// Selector matches the Service's labels; nil matches all.
	Selector labels.Selector
	// Annotations, when set, limits the plugin to services that carry at
	// least one of these annotation keys (a plugin driven by annotations
	// then never sees the others).
	Annotations []string
}

// matches reports whether s is one of the services the plugin sees.
func (m Match) matches(s *plan.Service) bool {
	if len(m.Namespaces) > 0 && !slices.Contains(m.Namespaces, s.Key.Namespace) {
		return false
	}
	if len(m.Annotations) > 0 && !slices.ContainsFunc(m.Annotations, func(k string) bool { _, ok := s.Annotations[k]; return ok }) {
		return false
	}
	return m.Selector == nil || m.Selector.Matches(labels.Set(s.Labels))
}

// Config configures one plugin of the chain.
type Config struct {
	// Name identifies the plugin in logs and errors; unique within a chain.
	Name string
	// Path is the plugin's .wasm file.
	Path string
	// SHA256 pins the file's hex sha256; "" does not pin it.
	SHA256 string
	// Config is the plugin's configuration as decoded from YAML (maps,
	// slices, scalars); the plugin receives it as JSON.
	Config any
	// FailurePolicy is what a failed batch's services get; "" means open.
	FailurePolicy Policy
	// Timeout bounds each call into the plugin; 0 means 100ms.
	Timeout time.Duration
	// MemoryLimit caps each instance's linear memory in bytes; 0 means
	// 64 MiB, and it is at least 64 pages (4 MiB). A plugin has at most two
	// instances, so it costs the host at most about twice this.
	MemoryLimit uint64
	// Match selects the services the plugin sees.
	Match Match
}

// Defaults and limits of a plugin's configuration.
const (
	defaultTimeout     = 100 * time.Millisecond
	defaultMemoryLimit = 64 << 20
	pageSize           = 65536
	minPages           = 64
	maxPages           = 65536 // wasm32 addresses 4 GiB
)

// settings is a Config checked and completed with defaults.
type settings struct {
	Config
	pages  uint32 // memory limit in wasm pages
	config []byte // Config.Config as JSON
}

// check validates c and fills in its defaults.
func check(c Config) (*settings, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("plugin %q: "+format, append([]any{c.Name}, args...)...)
	}
	if c.Name == "" {
		return nil, fmt.Errorf("plugin with path %q has no name", c.Path)
	}
	if c.Path == "" {
		return nil, fail("no path to a .wasm file")
	}
	if c.SHA256 != "" {
		if b, err := hex.DecodeString(c.SHA256); err != nil || len(b) != 32 {
			return nil, fail("sha256 %q is not 64 hex digits", c.SHA256)
		}
		c.SHA256 = strings.ToLower(c.SHA256)
	}
	switch c.FailurePolicy {
	case "":
		c.FailurePolicy = PolicyOpen
	case PolicyOpen, PolicyClosed:
	default:
		return nil, fail("failurePolicy %q is neither %q nor %q", c.FailurePolicy, PolicyOpen, PolicyClosed)
	}
	switch {
	case c.Timeout < 0:
		return nil, fail("timeout %s is negative", c.Timeout)
	case c.Timeout == 0:
		c.Timeout = defaultTimeout
	}
	if c.MemoryLimit == 0 {
		c.MemoryLimit = defaultMemoryLimit
	}
	pages := min(max(c.MemoryLimit/pageSize, minPages), maxPages)
	c.MemoryLimit = pages * pageSize
	config, err := json.Marshal(c.Config)
	if err != nil {
		return nil, fail("config cannot be handed to the plugin as JSON: %v", err)
	}
	return &settings{Config: c, pages: uint32(pages), config: config}, nil
}

// Options configures a Chain as a whole.
type Options struct {
	// CacheDir holds wazero's compilation cache; "" keeps it in memory only.
	CacheDir string
	// Log receives the chain's logs and the plugins' output; nil means slog.Default().
	Log *slog.Logger
	// Now is the quarantine clock; nil means time.Now.
	Now func() time.Time
	// OnReload is called after a watched plugin file was reloaded.
	OnReload func()
	// OnChange, when set, is called for each service a plugin changed. It
	// runs inside Apply and must not call the Chain.
	OnChange func(plugin string, before, after *plan.Service)
	// Observer, when set, is told of every plugin call and quarantine
	// change, for metrics.
	Observer Observer
}

// Observer receives each plugin's calls and quarantine changes. Its
// methods are called from several goroutines at once, with the chain's
// lock held: they must be quick and must not call the Chain.
type Observer interface {
	// PluginCalled reports one call: how long it took and its error, nil
	// when it succeeded.
	PluginCalled(plugin string, took time.Duration, err error)
	// PluginQuarantined reports that a plugin entered (true) or left
	// (false) quarantine.
	PluginQuarantined(plugin string, quarantined bool)
}

// PluginError reports a plugin that failed on some services of an Apply;
// its failure policy has already been applied to them.
type PluginError struct {
	// Plugin is the plugin's name.
	Plugin string
	// Policy is the failure policy that was applied.
	Policy Policy
	// Services counts the services the failure affected.
	Services int
	// Err says what went wrong.
	Err error
}

// Error describes the failure and what the services got instead.
func (e *PluginError) Error() string {
	outcome := "passed through unchanged"
	if e.Policy == PolicyClosed {
		outcome = "kept their last good rules"
	}
	services := "services"
	if e.Services == 1 {
		services = "service"
	}
	return fmt.Sprintf("plugin %q failed on %d %s (failurePolicy %s: %s): %v",
		e.Plugin, e.Services, services, e.Policy, outcome, e.Err)
}

// Unwrap returns the underlying error.
func (e *PluginError) Unwrap() error { return e.Err }

// errClosed fails the calls made after Close.
var errClosed = errors.New("the plugin chain is closed")
