package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// variant is one way of running Weir the benchmark measures.
type variant struct {
	label string
	// config is the config file Weir runs with ("" for the defaults).
	config string
	// cacheDir is the plugins' compilation cache ("" without plugins),
	// warmed by an untimed sync --once before the timed one.
	cacheDir string
}

// variants returns the default nftables mode, then the same through three
// plugins from pluginDir (if set), then mode iptables with each flavour
// listed in flavours; config files are written to temporary files.
func variants(pluginDir, flavours string) ([]variant, error) {
	vs := []variant{{label: "nftables"}}
	if pluginDir != "" {
		cfg, cache, err := pluginConfig(pluginDir)
		if err != nil {
			return vs, err
		}
		vs = append(vs, variant{"nftables + 3 plugins", cfg, cache})
	}
	for _, fl := range strings.Split(flavours, ",") {
		if fl = strings.TrimSpace(fl); fl == "" {
			continue
		}
		cfg, err := writeConfig("mode: iptables\niptables:\n  backend: " + fl + "\n")
		if err != nil {
			return vs, err
		}
		vs = append(vs, variant{label: "iptables-" + fl, config: cfg})
	}
	return vs, nil
}

// removeVariants removes the variants' config files and caches.
func removeVariants(vs []variant) {
	for _, v := range vs {
		for _, path := range []string{v.config, v.cacheDir} {
			if path != "" {
				os.RemoveAll(path)
			}
		}
	}
}

// pluginConfig writes a Weir config running drain (which takes node-2's
// endpoints out of every service: every service changes), zone-preference
// and affinity (which find nothing to change) from dir. It returns its path
// and the compilation cache folder it names.
func pluginConfig(dir string) (cfg, cache string, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	if cache, err = os.MkdirTemp("", "weir-bench-cache-"); err != nil {
		return "", "", err
	}
	cfg, err = writeConfig(fmt.Sprintf(`hooks:
  cacheDir: %s
plugins:
  - name: drain
    path: %s/drain.wasm
    config: {nodes: [node-2]}
  - name: zone-preference
    path: %s/zone-preference.wasm
  - name: affinity
    path: %s/affinity.wasm
`, cache, abs, abs, abs))
	return cfg, cache, err
}

// writeConfig writes a Weir config file and returns its path.
func writeConfig(text string) (string, error) {
	f, err := os.CreateTemp("", "weir-bench-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.WriteString(text)
	return f.Name(), err
}
