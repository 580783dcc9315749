package config

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/weirproxy/weir/hooks"
)

// pluginKeys are the keys of one plugins entry, in the order docs list them.
var pluginKeys = []string{"name", "path", "sha256", "publicKey", "dockerConfig", "refreshInterval", "config", "failurePolicy", "timeout", "memoryLimit", "signals", "interval", "match"}

// matchKeys are the keys of an entry's match section.
var matchKeys = []string{"namespaces", "selector", "annotations"}

// A pin of decimal digits only (64 zeros, say) is a number to YAML unless
// quoted; the message must say why it shows what YAML read.
const allowedQuotedSHA256 = `the file's SHA-256 as 64 hex digits in quotes (sha256: "..."): YAML read the unquoted value as the number `

var allowedPluginMatch = allowedSection + strings.Join(matchKeys, ", ")

// pluginEntry is one plugins entry being read: the values as written, the
// plugin's configuration read from them, and the problems found, by key
// relative to the entry ("timeout", "match.selector").
//
// This package only reads the YAML; what a value may be is hooks.Check's
// to say, and what a key accepts hooks.Allowed's.
type pluginEntry struct {
	raw      map[string]any
	cfg      hooks.Config
	problems map[string]*bad
}

// readPlugin reads one plugins entry, noting the values it cannot read.
func readPlugin(raw map[string]any) *pluginEntry {
	e := &pluginEntry{raw: raw, problems: map[string]*bad{}}
	e.cfg = hooks.Config{
		Name:            e.text("name"),
		Path:            e.text("path"),
		SHA256:          e.sha256(),
		PublicKey:       e.text("publicKey"),
		DockerConfig:    e.text("dockerConfig"),
		RefreshInterval: e.duration("refreshInterval"),
		Config:          raw["config"],
		FailurePolicy:   hooks.Policy(e.text("failurePolicy")),
		Timeout:         e.duration("timeout"),
		MemoryLimit:     e.memoryLimit(),
		Interval:        e.duration("interval"),
	}
	if raw["signals"] != nil {
		e.cfg.Signals = e.list("signals", true)
	}
	e.readMatch()
	return e
}

// value returns the value written at key, which may be one of the match
// section's ("match.selector").
func (e *pluginEntry) value(key string) any {
	if sub, ok := strings.CutPrefix(key, "match."); ok {
		m, _ := e.raw["match"].(map[string]any)
		return m[sub]
	}
	return e.raw[key]
}

// fail notes that the value at key is not allowed.
func (e *pluginEntry) fail(key, allowed string) {
	e.problems[key] = &bad{show(e.value(key)), allowed}
}

// text reads a single value; "" when it is absent or cannot be read.
func (e *pluginEntry) text(key string) string {
	v := e.value(key)
	s, ok := scalar(v)
	if !ok && v != nil {
		e.fail(key, hooks.Allowed(key))
	}
	return s
}

// sha256 reads the pin, which YAML may have read as a number.
func (e *pluginEntry) sha256() string {
	if v := e.raw["sha256"]; isNumber(v) {
		e.fail("sha256", allowedQuotedSHA256+fmt.Sprint(v))
		return ""
	}
	return e.text("sha256")
}

// isNumber reports whether YAML read raw as a number.
func isNumber(raw any) bool {
	switch raw.(type) {
	case int, int64, uint64, float64:
		return true
	}
	return false
}

// duration reads a duration, timeout, refreshInterval or interval; 0 when it is
// absent. A written value must be positive: hooks.Config takes 0 for its
// default, and a file asks for that by leaving the key out.
func (e *pluginEntry) duration(key string) time.Duration {
	if e.raw[key] == nil {
		return 0
	}
	d, err := time.ParseDuration(e.text(key))
	if err != nil || d <= 0 {
		e.fail(key, hooks.Allowed(key))
		return 0
	}
	return d
}

// memoryLimit reads the memory limit, a quantity such as 64Mi; 0 when it is
// absent. A written value must be positive, as a timeout must.
func (e *pluginEntry) memoryLimit() uint64 {
	if e.raw["memoryLimit"] == nil {
		return 0
	}
	q, err := resource.ParseQuantity(e.text("memoryLimit"))
	if err != nil || q.Value() <= 0 {
		e.fail("memoryLimit", hooks.Allowed("memoryLimit"))
		return 0
	}
	return uint64(q.Value())
}

// readMatch reads the match section.
func (e *pluginEntry) readMatch() {
	raw := e.raw["match"]
	if raw == nil {
		return
	}
	m, ok := raw.(map[string]any)
	if !ok {
		e.fail("match", allowedPluginMatch)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch k {
		case "namespaces":
			e.cfg.Match.Namespaces = e.list("match.namespaces", false)
		case "annotations":
			// An empty list would send the plugin every service.
			e.cfg.Match.Annotations = e.list("match.annotations", true)
		case "selector":
			e.cfg.Match.Selector = e.selector()
		default:
			e.fail("match."+k, allowedPluginMatch)
		}
	}
}

// list reads a list of names, which must not be empty when nonEmpty is set.
func (e *pluginEntry) list(key string, nonEmpty bool) []string {
	items, ok := list(e.value(key))
	if !ok || nonEmpty && len(items) == 0 {
		e.fail(key, hooks.Allowed(key))
		return nil
	}
	return items
}

// selector reads a label selector in kubectl's syntax.
func (e *pluginEntry) selector() labels.Selector {
	s, ok := scalar(e.value("match.selector"))
	sel, err := labels.Parse(s)
	if !ok || err != nil {
		e.fail("match.selector", hooks.Allowed("match.selector"))
		return nil
	}
	return sel
}

// decodePlugins reads every plugins entry into c.Plugins, and has
// hooks.Check judge the values that could be read.
func (l *loader) decodePlugins(c *Config) {
	entries := make([]*pluginEntry, len(c.pluginEntries))
	for i, raw := range c.pluginEntries {
		entries[i] = readPlugin(raw)
		c.Plugins = append(c.Plugins, entries[i].cfg)
	}
	for _, fe := range hooks.Check(c.Plugins) {
		if e := entries[fe.Index]; e.problems[fe.Key] == nil {
			e.fail(fe.Key, fe.Allowed)
		}
	}
	for i, e := range entries {
		l.reportPlugin(i, e)
	}
}

// reportPlugin records the problems of the i-th entry, with keys named
// from the top of the file ("plugins[1].timeout").
func (l *loader) reportPlugin(i int, e *pluginEntry) {
	prefix, src := fmt.Sprintf("plugins[%d].", i), l.source("plugins")
	for _, k := range slices.Sorted(maps.Keys(e.raw)) {
		if !slices.Contains(pluginKeys, k) {
			l.errs = append(l.errs, &Error{Key: prefix + k, Allowed: strings.Join(pluginKeys, ", "),
				Source: src, kind: kindUnknownKey})
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(e.problems), byPluginKey) {
		l.errs = append(l.errs, &Error{Key: prefix + k, Value: e.problems[k].value, Allowed: e.problems[k].allowed, Source: src})
	}
}

// byPluginKey orders an entry's keys as pluginKeys does, and a section's
// keys by name.
func byPluginKey(a, b string) int {
	rank := func(key string) int {
		top, _, _ := strings.Cut(key, ".")
		return slices.Index(pluginKeys, top)
	}
	return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b))
}
