package hooks

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/weirproxy/weir/hooks/oci"
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

// Config configures one plugin of the chain. Check says which values New
// refuses; a zero FailurePolicy, Timeout or MemoryLimit takes its default.
type Config struct {
	// Name identifies the plugin in logs, metrics and errors: lower-case
	// letters, digits and '-', at most 63 characters, unique within a chain.
	Name string
	// Path is the plugin's .wasm file, or an artifact in a registry:
	// oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:DIGEST (see
	// package hooks/oci for its layout).
	Path string
	// SHA256 pins the .wasm's sha256 as 64 hex digits; "" does not pin it.
	SHA256 string
	// DockerConfig is a docker config file holding the registry's
	// credentials, for an oci:// Path; "" means anonymous access.
	DockerConfig string
	// PublicKey is a PEM ECDSA P-256 public key, for an oci:// Path: when
	// set, only artifacts it signed (cosign-compatible) load.
	PublicKey string
	// RefreshInterval is how often an oci:// Path's tag is resolved again,
	// reloading the plugin when it moved: 1s to 24h, or 0 for
	// DefaultRefreshInterval. A digest never moves.
	RefreshInterval time.Duration
	// Config is the plugin's configuration as decoded from YAML (maps,
	// slices, scalars); the plugin receives it as JSON.
	Config any
	// FailurePolicy is what a failed batch's services get; "" means open.
	FailurePolicy Policy
	// Timeout bounds each call into the plugin: 1ms to 10s, or 0 for
	// DefaultTimeout.
	Timeout time.Duration
	// MemoryLimit caps each instance's linear memory in bytes: 4 MiB to
	// 4 GiB, rounded down to whole 64 KiB pages, or 0 for 64 MiB. A plugin
	// has at most two instances, so it costs the host at most about twice
	// this.
	MemoryLimit uint64
	// Match selects the services the plugin sees.
	Match Match
	// Signals lists the live signals the plugin wants; SignalConnections
	// is the only one. A plugin with signals must speak ABI version 2: it
	// gets version 2 batches, and is called again every Interval for the
	// services whose signals moved.
	Signals []string
	// Interval is how often the signals are read for the plugin: 100ms to
	// 1h, or 0 for DefaultSignalInterval; only with Signals.
	Interval time.Duration
}

// SignalConnections is the signal of each endpoint's active and new
// connections through Weir's rules on this node.
const SignalConnections = "connections"

// DefaultSignalInterval is how often the signals of a plugin whose
// Interval is 0 are read.
const DefaultSignalInterval = 2 * time.Second

// DefaultTimeout bounds each call into a plugin whose Timeout is 0.
const DefaultTimeout = 100 * time.Millisecond

// DefaultRefreshInterval is how often an oci:// plugin's tag is resolved
// again when its RefreshInterval is 0.
const DefaultRefreshInterval = 5 * time.Minute

// Limits and defaults of a plugin's configuration.
const (
	minInterval        = 100 * time.Millisecond
	maxInterval        = time.Hour
	minRefresh         = time.Second
	maxRefresh         = 24 * time.Hour
	minTimeout         = time.Millisecond
	maxTimeout         = 10 * time.Second
	pageSize           = 65536
	defaultMemoryLimit = 64 << 20
	minMemoryLimit     = 64 * pageSize
	maxMemoryLimit     = 65536 * pageSize // wasm32 addresses 4 GiB
)

var (
	dnsLabel  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// allowed says what each key of a plugins entry accepts, worded to follow
// "use" in an error message; keys are spelt as in Weir's configuration file.
var allowed = map[string]string{
	"name":            "a unique name of lower-case letters, digits and '-', at most 63 characters, such as zone-preference",
	"path":            "the path of the plugin's .wasm file, or oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:DIGEST",
	"sha256":          "the file's SHA-256 as 64 hex digits (sha256sum prints it), or leave it out",
	"dockerConfig":    "the path of a docker config file with the registry's credentials, with an oci:// path only",
	"publicKey":       "the path of a PEM ECDSA P-256 public key (cosign.pub), with an oci:// path only",
	"refreshInterval": "a duration between 1s and 24h, such as 5m, with an oci:// path only",
	"failurePolicy":   fmt.Sprintf("%s or %s", PolicyOpen, PolicyClosed),
	"timeout":         fmt.Sprintf("a duration between %s and %s, such as %s", minTimeout, maxTimeout, DefaultTimeout),
	"memoryLimit": fmt.Sprintf("a size between %s and %s, such as %s",
		size(minMemoryLimit), size(maxMemoryLimit), size(defaultMemoryLimit)),
	"signals":           "a list of signals; the only one is " + SignalConnections,
	"interval":          fmt.Sprintf("a duration between %s and %s, such as %s, with signals only", minInterval, maxInterval, DefaultSignalInterval),
	"match.namespaces":  "a list of namespace names",
	"match.selector":    "a label selector such as app=web,tier!=db or 'env in (prod, staging)'",
	"match.annotations": "a list of annotation keys such as canary.weir.dev/split",
}

// size writes a byte count as a memoryLimit is written, such as 64Mi.
func size(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// Allowed says what a key of a plugins entry, such as "timeout" or
// "match.selector", accepts, worded to follow "use"; "" for another key.
func Allowed(key string) string { return allowed[key] }

// FieldError is a value Check refuses: one key of one plugin of a list.
type FieldError struct {
	// Index is the plugin's position in the list.
	Index int
	// Key is the key as a plugins entry spells it, such as "timeout" or
	// "match.namespaces".
	Key string
	// Value is the refused value as text.
	Value string
	// Allowed says what the key accepts, worded to follow "use".
	Allowed string
}

// Error names the plugin's entry and the key, as configuration errors do.
func (e *FieldError) Error() string {
	return fmt.Sprintf("plugins[%d].%s: %q is not allowed; use %s", e.Index, e.Key, e.Value, e.Allowed)
}

// Check validates the configuration of a chain's plugins, in order, and
// returns one FieldError per refused value: New refuses the same.
func Check(plugins []Config) []*FieldError {
	var errs []*FieldError
	first := map[string]int{}
	for i, c := range plugins {
		errs = append(errs, checkValues(i, c)...)
		j, dup := first[c.Name]
		switch {
		case dup:
			errs = append(errs, &FieldError{Index: i, Key: "name", Value: c.Name,
				Allowed: fmt.Sprintf("a name not used by another plugin (plugins[%d] has it)", j)})
		case dnsLabel.MatchString(c.Name):
			first[c.Name] = i
		}
	}
	return errs
}

// checkValues validates the values of c, the i-th plugin, leaving out
// whether its name is unique.
func checkValues(i int, c Config) []*FieldError {
	var errs []*FieldError
	refuse := func(key, value string, bad bool) {
		if bad {
			errs = append(errs, &FieldError{Index: i, Key: key, Value: value, Allowed: allowed[key]})
		}
	}
	refuse("name", c.Name, !dnsLabel.MatchString(c.Name))
	refuse("path", c.Path, c.Path == "" || badLocation(c.Path))
	remote := oci.IsLocation(c.Path)
	refuse("dockerConfig", c.DockerConfig, c.DockerConfig != "" && !remote)
	refuse("publicKey", c.PublicKey, c.PublicKey != "" && !remote)
	refuse("refreshInterval", c.RefreshInterval.String(), c.RefreshInterval != 0 &&
		(!remote || c.RefreshInterval < minRefresh || c.RefreshInterval > maxRefresh))
	refuse("sha256", c.SHA256, c.SHA256 != "" && !sha256Hex.MatchString(c.SHA256))
	refuse("failurePolicy", string(c.FailurePolicy), !slices.Contains([]Policy{"", PolicyOpen, PolicyClosed}, c.FailurePolicy))
	refuse("timeout", c.Timeout.String(), c.Timeout != 0 && (c.Timeout < minTimeout || c.Timeout > maxTimeout))
	refuse("memoryLimit", strconv.FormatUint(c.MemoryLimit, 10),
		c.MemoryLimit != 0 && (c.MemoryLimit < minMemoryLimit || c.MemoryLimit > maxMemoryLimit))
	refuse("signals", strings.Join(c.Signals, ","),
		slices.ContainsFunc(c.Signals, func(s string) bool { return s != SignalConnections }))
	refuse("interval", c.Interval.String(), c.Interval != 0 &&
		(len(c.Signals) == 0 || c.Interval < minInterval || c.Interval > maxInterval))
	refuse("match.namespaces", strings.Join(c.Match.Namespaces, ","),
		slices.ContainsFunc(c.Match.Namespaces, func(n string) bool { return !dnsLabel.MatchString(n) }))
	refuse("match.annotations", strings.Join(c.Match.Annotations, ","),
		slices.ContainsFunc(c.Match.Annotations, func(k string) bool { return strings.ContainsAny(k, " \t=") }))
	return errs
}

// joined is Check's errors as one error; nil when there are none.
func joined(errs []*FieldError) error {
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// settings is a checked Config completed with its defaults.
type settings struct {
	Config
	pages  uint32     // memory limit in wasm pages
	config []byte     // Config.Config as JSON
	oci    *ociSource // the registry client of an oci:// Path; nil for a file
}

// complete fills in the defaults of c, which Check passed.
func complete(c Config) (*settings, error) {
	if c.FailurePolicy == "" {
		c.FailurePolicy = PolicyOpen
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MemoryLimit == 0 {
		c.MemoryLimit = defaultMemoryLimit
	}
	if c.Interval == 0 && len(c.Signals) > 0 {
		c.Interval = DefaultSignalInterval
	}
	c.SHA256 = strings.ToLower(c.SHA256)
	pages := c.MemoryLimit / pageSize
	c.MemoryLimit = pages * pageSize
	config, err := json.Marshal(c.Config)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: config cannot be handed to the plugin as JSON: %w", c.Name, err)
	}
	return &settings{Config: c, pages: uint32(pages), config: config}, nil
}

// prepare completes c, as complete does, and sets up the registry client
// of an oci:// plugin.
func prepare(c Config, opts Options) (*settings, error) {
	s, err := complete(c)
	if err != nil || !oci.IsLocation(c.Path) {
		return s, err
	}
	if s.RefreshInterval == 0 {
		s.RefreshInterval = DefaultRefreshInterval
	}
	if s.oci, err = newOCISource(s.Config, opts); err != nil {
		return nil, err
	}
	return s, nil
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
