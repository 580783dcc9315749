package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/source/files"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
)

// pluginTest is what weir plugin test was asked to do.
type pluginTest struct {
	plugin, config, manifests, nodeName, cacheDir string
	timeout                                       time.Duration
}

// runPluginCommand runs "weir plugin test": it plans the manifests, runs one
// plugin over every service and prints each service before and after, as a
// diff. It exits non-zero when the plugin fails.
func runPluginCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "test" {
		return fmt.Errorf("%w: use weir plugin test --plugin X.wasm [--config c.yaml] --manifests DIR", errUsage)
	}
	var t pluginTest
	fs := pflag.NewFlagSet("weir plugin test", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&t.plugin, "plugin", "", "the plugin's .wasm file (required)")
	fs.StringVar(&t.config, "config", "", "YAML file holding the plugin's config value")
	fs.StringVar(&t.manifests, "manifests", "", "folder of Service, EndpointSlice and Node manifests (required)")
	fs.StringVar(&t.nodeName, "node-name", defaultNode(), "the node to plan for")
	fs.StringVar(&t.cacheDir, "cache-dir", "", "compilation cache folder; empty compiles in memory")
	fs.DurationVar(&t.timeout, "timeout", hooks.DefaultTimeout, "longest call into the plugin")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if t.plugin == "" || t.manifests == "" || fs.NArg() > 0 {
		return fmt.Errorf("%w: weir plugin test needs --plugin and --manifests and takes no arguments", errUsage)
	}
	return t.run(stdout, slog.New(slog.NewTextHandler(stderr, nil)))
}

func defaultNode() string {
	name, _ := os.Hostname()
	return strings.ToLower(name)
}

func (t pluginTest) run(stdout io.Writer, log *slog.Logger) error {
	ctx, cancel := signalContext()
	defer cancel()
	cfg, err := t.pluginConfig()
	if err != nil {
		return err
	}
	p := proxy.New(proxy.Options{NodeName: t.nodeName, Log: slog.New(slog.DiscardHandler)})
	if err := p.LoadOnce(ctx, files.New(t.manifests, log)); err != nil {
		return fmt.Errorf("manifests %s: %w", t.manifests, err)
	}
	if err := p.Sync(ctx, true); err != nil {
		return err
	}
	planned := p.Planned()
	name := strings.TrimSuffix(filepath.Base(t.plugin), ".wasm")
	chain, err := hooks.New(ctx, []hooks.Config{{Name: name, Path: t.plugin, Config: cfg, Timeout: t.timeout,
		FailurePolicy: hooks.PolicyClosed}}, hooks.Options{CacheDir: t.cacheDir, Log: log})
	if err != nil {
		return err
	}
	defer closeChain(chain)
	keys := planned.Keys()
	in := make([]*plan.Service, len(keys))
	for i, k := range keys {
		in[i] = planned.Services[k]
	}
	out, err := chain.Apply(ctx, planned.Node, in, true)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, beforeAfter(name, in, out))
	return err
}

// pluginConfig reads the plugin's config value from its YAML file.
func (t pluginTest) pluginConfig() (any, error) {
	if t.config == "" {
		return nil, nil
	}
	data, err := os.ReadFile(t.config)
	if err != nil {
		return nil, err
	}
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", t.config, err)
	}
	return v, nil
}

// beforeAfter renders every service as a unified diff of its plan before
// and after the plugin, then a count.
func beforeAfter(plugin string, in, out []*plan.Service) string {
	var b strings.Builder
	changed := 0
	for i, s := range in {
		if s.Equal(out[i]) {
			fmt.Fprintf(&b, "= %s unchanged\n", s.Key)
			continue
		}
		changed++
		fmt.Fprintf(&b, "--- %s before %s\n+++ %s after %s\n", s.Key, plugin, s.Key, plugin)
		for _, l := range lineDiff(serviceLines(s), serviceLines(out[i])) {
			b.WriteString(string(l.op) + l.text + "\n")
		}
	}
	fmt.Fprintf(&b, "%s changed %d of %d services\n", plugin, changed, len(in))
	return b.String()
}
