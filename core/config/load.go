package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/sysctl"
)

const sourceDefault = "default"

// loader merges the layers into one koanf instance and remembers where the
// current value of each key came from, so errors can name it.
type loader struct {
	k      *koanf.Koanf
	origin map[string]string // key → "file …", "environment WEIR_…" or "flag --…"
	errs   []error
	// warnings are about KubeProxyConfiguration fields Weir ignores.
	warnings []string
}

func newLoader() *loader {
	return &loader{k: koanf.New("."), origin: map[string]string{}}
}

// merge records the origin of every known key present in lk, then merges lk
// over the values loaded so far.
func (l *loader) merge(lk *koanf.Koanf, source func(*field) string) error {
	for i := range fields {
		if f := &fields[i]; lk.Exists(f.key) {
			l.origin[f.key] = source(f)
		}
	}
	return l.k.Merge(lk)
}

func (l *loader) source(key string) string {
	if s, ok := l.origin[key]; ok {
		return s
	}
	return sourceDefault
}

func (l *loader) loadDefaults() error {
	def := Default()
	mp := map[string]any{}
	for i := range fields {
		if v := fields[i].get(def); v != nil && fields[i].byMode == nil {
			mp[fields[i].key] = v
		}
	}
	lk := koanf.New(".")
	if err := lk.Load(confmap.Provider(mp, "."), nil); err != nil {
		return &Error{Source: sourceDefault, kind: kindUnreadable, err: err}
	}
	return l.merge(lk, func(*field) string { return sourceDefault })
}

// loadFile reads the YAML file, reports unknown keys, and merges the known,
// non-null ones.
func (l *loader) loadFile(path string) error {
	src := "file " + path
	fk := koanf.New(".")
	if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
		kind := kindMalformed
		if errors.As(err, new(*fs.PathError)) {
			kind = kindUnreadable
		}
		return &Error{Value: path, Source: src, kind: kind, err: err}
	}
	raw := fk.Raw()
	if isKubeProxyConfig(raw) {
		raw = l.fromKubeProxy(raw, src)
	}
	clean := l.checkKeys(raw, "", src)
	lk := koanf.New(".")
	if err := lk.Load(confmap.Provider(clean, ""), nil); err != nil {
		return &Error{Value: path, Source: src, kind: kindMalformed, err: err}
	}
	return l.merge(lk, func(*field) string { return src })
}

// checkKeys walks one level of the YAML map m under prefix, records an error
// for every unknown key and every section that is not a mapping, and returns
// a copy holding only the known keys. A key with a null value ("key:" with
// nothing after it) is treated as absent.
func (l *loader) checkKeys(m map[string]any, prefix, src string) map[string]any {
	clean := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key, v := joinKey(prefix, name), m[name]
		switch {
		case strings.Contains(name, ".") || !slices.Contains(sections[prefix], name):
			l.errs = append(l.errs, &Error{Key: key, Source: src,
				Allowed: strings.Join(sections[prefix], ", "), kind: kindUnknownKey})
		case v == nil:
		case byKey[key] != nil:
			clean[name] = v
		default:
			sub, ok := v.(map[string]any)
			if !ok {
				l.errs = append(l.errs, &Error{Key: key, Value: show(v), Source: src,
					Allowed: allowedSection + strings.Join(sections[key], ", ")})
				continue
			}
			clean[name] = l.checkKeys(sub, key, src)
		}
	}
	return clean
}

// loadEnv merges the WEIR_* variables of environ, reporting unknown ones.
// WEIR_CONFIG is read separately, by configPath.
func (l *loader) loadEnv(environ []string) error {
	var unknown []string
	lk := koanf.New(".")
	p := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			f := byEnv[name]
			switch {
			case name == configEnv || name == sysctl.RootEnv:
				// Not configuration keys: the file to read, and where
				// internal/sysctl finds the sysctl tree.
				return "", nil
			case f == nil:
				unknown = append(unknown, name)
				return "", nil
			}
			return f.key, value
		},
	})
	if err := lk.Load(p, nil); err != nil {
		return &Error{Source: "environment", kind: kindUnreadable, err: err}
	}
	slices.Sort(unknown)
	for _, name := range slices.Compact(unknown) {
		l.errs = append(l.errs, &Error{Key: name, Source: "environment " + name,
			Allowed: strings.Join(envNames(), ", "), kind: kindUnknownEnv})
	}
	return l.merge(lk, func(f *field) string { return "environment " + envName(f.key) })
}

// envNames lists the known variables, in table order.
func envNames() []string {
	names := []string{configEnv}
	for i := range fields {
		if fields[i].env {
			names = append(names, envName(fields[i].key))
		}
	}
	return names
}

// loadFlags merges the flags the user set; flags left at their default and
// flags this package does not know (such as --help) are ignored.
func (l *loader) loadFlags(flags *pflag.FlagSet) error {
	if flags == nil {
		return nil
	}
	lk := koanf.New(".")
	p := posflag.ProviderWithFlag(flags, ".", nil, func(fl *pflag.Flag) (string, any) {
		f := byFlag[fl.Name]
		if f == nil || !fl.Changed {
			return "", nil
		}
		return f.key, fl.Value.String()
	})
	if err := lk.Load(p, nil); err != nil {
		return &Error{Source: "flags", kind: kindUnreadable, err: err}
	}
	return l.merge(lk, func(f *field) string { return "flag --" + f.flag })
}

// decode validates every key of the merged configuration into a Config,
// recording one error per bad key. Keys whose default depends on the mode
// and that no layer set get the default of the mode the layers chose.
func (l *loader) decode() *Config {
	c := &Config{}
	failed, unset := l.decodeKeys(c)
	if !failed["mode"] {
		for _, f := range unset {
			f.byMode(c)
		}
		c.Ineffective = ineffective(c, unset)
	}
	if !failed["syncPeriod"] && !failed["minSyncPeriod"] && c.MinSyncPeriod > c.SyncPeriod {
		allowed := fmt.Sprintf("a duration no longer than syncPeriod (%s, from %s)",
			c.SyncPeriod, l.source("syncPeriod"))
		l.errs = append(l.errs, l.valueError("minSyncPeriod", &bad{show(l.k.Get("minSyncPeriod")), allowed}))
	}
	l.decodePlugins(c)
	c.Warnings = l.warnings
	const prefixKey = "localDetector.interfaceNamePrefix"
	if c.LocalDetector.Mode == backends.DetectInterfaceNamePrefix && c.LocalDetector.InterfaceNamePrefix == "" && !failed[prefixKey] {
		l.errs = append(l.errs, l.valueError(prefixKey,
			&bad{"", fmt.Sprintf("%s (localDetector.mode is %s)", allowedIfPrefix, backends.DetectInterfaceNamePrefix)}))
	}
	return c
}

// decodeKeys sets every key some layer set, and returns the keys that
// failed and those left to their mode's default.
func (l *loader) decodeKeys(c *Config) (failed map[string]bool, unset []*field) {
	failed = map[string]bool{}
	for i := range fields {
		f := &fields[i]
		raw := l.k.Get(f.key)
		if f.byMode != nil && isUnset(f, raw) {
			unset = append(unset, f)
			continue
		}
		if b := f.set(c, raw); b != nil {
			failed[f.key] = true
			l.errs = append(l.errs, l.valueError(f.key, b))
		}
	}
	return failed, unset
}

// ineffective names the settings given explicitly that the mode's
// defaults of the unset keys make ineffective: localhostNodePorts on in
// mode nftables, where node ports default to the primary IPs.
func ineffective(c *Config, unset []*field) []string {
	defaulted := slices.ContainsFunc(unset, func(f *field) bool { return f.key == "nodePortAddresses" })
	if !defaulted || !c.LocalhostNodePorts || !c.NodePortAddresses.Primary {
		return nil
	}
	return []string{"localhostNodePorts: true has no effect, since nodePortAddresses is unset and defaults to primary in mode " +
		c.Mode + "; set nodePortAddresses to [all] to serve node ports on 127.0.0.1 and every local address"}
}

func (l *loader) valueError(key string, b *bad) *Error {
	return &Error{Key: key, Value: b.value, Allowed: b.allowed, Source: l.source(key)}
}

// fromKubeProxy converts a KubeProxyConfiguration file (see kubeproxy.go),
// recording an error for each field it refuses and keeping the warnings
// for the caller to log.
func (l *loader) fromKubeProxy(raw map[string]any, src string) map[string]any {
	out, refused, warnings := fromKubeProxy(raw)
	for _, r := range refused {
		l.errs = append(l.errs, &Error{Key: r, Source: src, kind: kindKubeProxy})
	}
	l.warnings = append(l.warnings, warnings...)
	return out
}
