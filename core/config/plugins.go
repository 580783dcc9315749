package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
)

// Plugin is one hook plugin entry of the plugins list.
type Plugin struct {
	// Name identifies the plugin in logs and metrics; unique in the list.
	Name string
	// Path is the plugin's .wasm file.
	Path string
	// SHA256 pins the file's content (64 hex digits); empty leaves it unpinned.
	SHA256 string
	// Config is handed to the plugin as JSON; any YAML value, nil when unset.
	Config any
	// FailurePolicy is "open" (a failing plugin's input is used unchanged)
	// or "closed" (the services keep their last good rules).
	FailurePolicy string
	// Timeout bounds one call into the plugin.
	Timeout time.Duration
	// MemoryLimit caps the plugin's memory in bytes.
	MemoryLimit uint64
	// Namespaces, when set, limits the plugin to services in them.
	Namespaces []string
	// Selector, when set, limits the plugin to services whose labels match
	// it (kubectl's label selector syntax).
	Selector string
	// Annotations, when set, limits the plugin to services carrying at
	// least one of these annotation keys.
	Annotations []string
}

// Plugin defaults and bounds.
const (
	defaultPluginTimeout = 100 * time.Millisecond
	defaultPluginMemory  = 64 << 20
	minPluginMemory      = 64 << 16 // 64 WebAssembly pages
	maxPluginMemory      = 4 << 30  // the wasm32 address space
)

// pluginKeys are the keys of one plugins entry, in the order docs list them.
var pluginKeys = []string{"name", "path", "sha256", "config", "failurePolicy", "timeout", "memoryLimit", "match"}

var (
	pluginName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	sha256Hex  = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

const (
	allowedPluginName = "a unique name of lower-case letters, digits and '-', at most 63 characters, such as zone-preference"
	allowedPluginPath = "the path of the plugin's .wasm file"
	allowedSHA256     = "the file's SHA-256 as 64 hex digits (sha256sum prints it), or leave it out"
	// A pin of decimal digits only (64 zeros, say) is a number to YAML
	// unless quoted; the message must say why it shows what YAML read.
	allowedQuotedSHA256 = `the file's SHA-256 as 64 hex digits in quotes (sha256: "..."): YAML read the unquoted value as the number `
	allowedPolicy       = "open or closed"
	allowedTimeout      = "a duration between 1ms and 10s, such as 100ms"
	allowedMemory       = "a size between 4Mi and 4Gi, such as 64Mi"
	allowedNamespaces   = "a list of namespace names"
	allowedSelector     = "a label selector such as app=web,tier!=db or 'env in (prod, staging)'"
	allowedAnnotations  = "a list of annotation keys such as canary.weir.dev/split"
	allowedPluginMatch  = "a mapping with the keys namespaces, selector, annotations"
)

// pluginField is a bad value at one key of one plugins entry.
type pluginField struct {
	key string
	bad *bad
}

// decodePlugin validates one plugins entry; problems name their key
// relative to the entry.
func decodePlugin(raw map[string]any) (Plugin, []pluginField, []string) {
	p := Plugin{FailurePolicy: "open", Timeout: defaultPluginTimeout, MemoryLimit: defaultPluginMemory}
	var errs []pluginField
	fail := func(key string, value any, allowed string) {
		errs = append(errs, pluginField{key, &bad{show(value), allowed}})
	}
	var unknown []string
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if !slices.Contains(pluginKeys, k) {
			unknown = append(unknown, k)
		}
	}
	if s, ok := scalar(raw["name"]); !ok || !pluginName.MatchString(s) {
		fail("name", raw["name"], allowedPluginName)
	} else {
		p.Name = s
	}
	if s, ok := scalar(raw["path"]); !ok || s == "" {
		fail("path", raw["path"], allowedPluginPath)
	} else {
		p.Path = s
	}
	if v, ok := raw["sha256"]; ok && v != nil {
		s, ok := scalar(v)
		switch {
		case isNumber(v):
			fail("sha256", v, allowedQuotedSHA256+fmt.Sprint(v))
		case !ok || !sha256Hex.MatchString(s):
			fail("sha256", v, allowedSHA256)
		default:
			p.SHA256 = strings.ToLower(s)
		}
	}
	p.Config = raw["config"]
	if v, ok := raw["failurePolicy"]; ok && v != nil {
		if s, _ := scalar(v); s == "open" || s == "closed" {
			p.FailurePolicy = s
		} else {
			fail("failurePolicy", v, allowedPolicy)
		}
	}
	if v, ok := raw["timeout"]; ok && v != nil {
		s, _ := scalar(v)
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Millisecond || d > 10*time.Second {
			fail("timeout", v, allowedTimeout)
		} else {
			p.Timeout = d
		}
	}
	if v, ok := raw["memoryLimit"]; ok && v != nil {
		s, _ := scalar(v)
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Value() < minPluginMemory || q.Value() > maxPluginMemory {
			fail("memoryLimit", v, allowedMemory)
		} else {
			p.MemoryLimit = uint64(q.Value())
		}
	}
	errs = append(errs, decodeMatch(&p, raw["match"])...)
	return p, errs, unknown
}

// isNumber reports whether YAML read raw as a number.
func isNumber(raw any) bool {
	switch raw.(type) {
	case int, int64, uint64, float64:
		return true
	}
	return false
}

// decodeMatch validates an entry's match section.
func decodeMatch(p *Plugin, raw any) []pluginField {
	if raw == nil {
		return nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return []pluginField{{"match", &bad{show(raw), allowedPluginMatch}}}
	}
	var errs []pluginField
	for k, v := range m {
		switch k {
		case "namespaces":
			ns, ok := list(v)
			if !ok || slices.ContainsFunc(ns, func(n string) bool { return !dnsLabel.MatchString(n) }) {
				errs = append(errs, pluginField{"match.namespaces", &bad{show(v), allowedNamespaces}})
				continue
			}
			p.Namespaces = ns
		case "annotations":
			keys, ok := list(v)
			if !ok || len(keys) == 0 || slices.ContainsFunc(keys, func(k string) bool { return strings.ContainsAny(k, " \t=") }) {
				errs = append(errs, pluginField{"match.annotations", &bad{show(v), allowedAnnotations}})
				continue
			}
			p.Annotations = keys
		case "selector":
			s, ok := scalar(v)
			if _, err := labels.Parse(s); !ok || err != nil {
				errs = append(errs, pluginField{"match.selector", &bad{show(v), allowedSelector}})
				continue
			}
			p.Selector = s
		default:
			errs = append(errs, pluginField{"match." + k, &bad{show(v), allowedPluginMatch}})
		}
	}
	slices.SortFunc(errs, func(a, b pluginField) int { return strings.Compare(a.key, b.key) })
	return errs
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// decodePlugins validates every plugins entry into c.Plugins.
func (l *loader) decodePlugins(c *Config) {
	seen := map[string]int{}
	for i, raw := range c.pluginEntries {
		p, errs, unknown := decodePlugin(raw)
		prefix := fmt.Sprintf("plugins[%d].", i)
		for _, k := range unknown {
			l.errs = append(l.errs, &Error{Key: prefix + k, Allowed: strings.Join(pluginKeys, ", "),
				Source: l.source("plugins"), kind: kindUnknownKey})
		}
		for _, e := range errs {
			l.errs = append(l.errs, &Error{Key: prefix + e.key, Value: e.bad.value, Allowed: e.bad.allowed,
				Source: l.source("plugins")})
		}
		if j, dup := seen[p.Name]; dup && p.Name != "" {
			l.errs = append(l.errs, &Error{Key: prefix + "name", Value: p.Name, Source: l.source("plugins"),
				Allowed: fmt.Sprintf("a name not used by another plugin (plugins[%d] has it)", j)})
		}
		seen[p.Name] = i
		c.Plugins = append(c.Plugins, p)
	}
}
