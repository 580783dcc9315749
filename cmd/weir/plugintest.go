package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/source/files"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// pluginUsage lists the plugin subcommands.
const pluginUsage = "use weir plugin test --plugin X.wasm [--plugin Y.wasm ...] --manifests DIR, " +
	"weir plugin new --lang go NAME [DIR], or weir plugin push FILE.wasm oci://REGISTRY/REPO:TAG"

// pluginTest is what weir plugin test was asked to do.
type pluginTest struct {
	plugins, configs                      []string
	manifests, nodeName, cacheDir, expect string
	memoryLimit, policy, signals          string
	timeout                               time.Duration
	update                                bool
}

// runPluginCommand runs "weir plugin SUBCOMMAND": test, new or push.
func runPluginCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, pluginUsage)
	}
	switch args[0] {
	case "test":
		return runPluginTest(args[1:], stdout, stderr)
	case "new":
		return runPluginNew(args[1:], stdout, stderr)
	case "push":
		return runPluginPush(args[1:], stdout, stderr)
	}
	return fmt.Errorf("%w: unknown subcommand %q; %s", errUsage, args[0], pluginUsage)
}

// runPluginTest runs "weir plugin test": it plans the manifests, runs the
// plugins over every service as a chain, in order, and prints each service
// before and after, as a diff. It fails when a plugin fails, whatever the
// failure policy, and when the result differs from the --expect file.
func runPluginTest(args []string, stdout, stderr io.Writer) error {
	var t pluginTest
	fs := pflag.NewFlagSet("weir plugin test", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	t.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if len(t.plugins) == 0 || t.manifests == "" || fs.NArg() > 0 {
		return fmt.Errorf("%w: weir plugin test needs --plugin and --manifests and takes no arguments", errUsage)
	}
	if t.update && t.expect == "" {
		return fmt.Errorf("%w: --update writes the --expect file: give --expect FILE", errUsage)
	}
	cfgs, err := t.chainConfig()
	if err != nil {
		return err
	}
	return t.run(stdout, slog.New(slog.NewTextHandler(stderr, nil)), cfgs)
}

// addFlags registers weir plugin test's flags on fs.
func (t *pluginTest) addFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&t.plugins, "plugin", nil,
		"a plugin's .wasm file, or NAME=FILE; repeat to run several as a chain, in order (required)")
	fs.StringArrayVar(&t.configs, "config", nil,
		"YAML file holding a plugin's config value: FILE with one plugin, else NAME=FILE; repeatable")
	fs.StringVar(&t.manifests, "manifests", "", "folder of Service, EndpointSlice and Node manifests (required)")
	fs.StringVar(&t.nodeName, "node-name", defaultNode(), "the node to plan for")
	fs.StringVar(&t.cacheDir, "cache-dir", "", "compilation cache folder; empty compiles in memory")
	fs.DurationVar(&t.timeout, "timeout", hooks.DefaultTimeout, "longest call into each plugin")
	fs.StringVar(&t.memoryLimit, "memory-limit", "", "each plugin's memory limit, such as 64Mi (default 64Mi)")
	fs.StringVar(&t.policy, "failure-policy", string(hooks.PolicyOpen),
		"open or closed: what the services of a failed plugin get (the command fails either way)")
	fs.StringVar(&t.signals, "signals", "",
		"YAML file of live signals by endpoint, such as '10.244.0.11:8080: {active: 12, new: 3}': every plugin gets them (ABI version 2), as weir run's signals: [connections] does")
	fs.StringVar(&t.expect, "expect", "", "golden file: fail unless the services after the plugins are these")
	fs.BoolVar(&t.update, "update", false, "write the result to the --expect file instead of comparing")
}

func defaultNode() string {
	name, _ := os.Hostname()
	return strings.ToLower(name)
}

// chainConfig turns the flags into the chain's plugin configurations,
// checked as Weir checks its configuration file.
func (t pluginTest) chainConfig() ([]hooks.Config, error) {
	var limit uint64
	if t.memoryLimit != "" {
		q, err := resource.ParseQuantity(t.memoryLimit)
		if err != nil || q.Sign() <= 0 {
			return nil, fmt.Errorf("%w: --memory-limit %q: use %s", errUsage, t.memoryLimit, hooks.Allowed("memoryLimit"))
		}
		limit = uint64(q.Value())
	}
	cfgs := make([]hooks.Config, len(t.plugins))
	for i, p := range t.plugins {
		name, path := pluginName(p)
		cfgs[i] = hooks.Config{Name: name, Path: path, Timeout: t.timeout, MemoryLimit: limit,
			FailurePolicy: hooks.Policy(t.policy)}
		if t.signals != "" {
			cfgs[i].Signals = []string{hooks.SignalConnections}
		}
	}
	if err := t.addConfigs(cfgs); err != nil {
		return nil, err
	}
	if errs := hooks.Check(cfgs); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s", errUsage, flagError(errs[0], cfgs))
	}
	return cfgs, nil
}

// flagError words a configuration error in terms of the flags.
func flagError(e *hooks.FieldError, cfgs []hooks.Config) string {
	flag := map[string]string{"name": "--plugin NAME=", "failurePolicy": "--failure-policy",
		"timeout": "--timeout", "memoryLimit": "--memory-limit", "path": "--plugin"}[e.Key]
	if flag == "" {
		flag = e.Key
	}
	return fmt.Sprintf("%s %q (plugin %s): not allowed; use %s", flag, e.Value, cfgs[e.Index].Path, e.Allowed)
}

// pluginName splits a --plugin value into the plugin's name and file: the
// name is NAME of NAME=FILE, or the file's base name without .wasm.
func pluginName(v string) (name, path string) {
	if n, p, ok := strings.Cut(v, "="); ok && dnsName(n) {
		return n, p
	}
	return strings.ToLower(strings.TrimSuffix(filepath.Base(v), ".wasm")), v
}

// dnsName reports whether s can be a plugin's name.
func dnsName(s string) bool {
	return len(hooks.Check([]hooks.Config{{Name: s, Path: "x"}})) == 0
}

// addConfigs reads each --config file into the configuration of its plugin.
func (t pluginTest) addConfigs(cfgs []hooks.Config) error {
	for _, c := range t.configs {
		i, path := configTarget(c, cfgs)
		if i < 0 {
			return fmt.Errorf("%w: --config %q: with several plugins, use NAME=FILE where NAME is one of %s",
				errUsage, c, strings.Join(names(cfgs), ", "))
		}
		v, err := readPluginConfig(path)
		if err != nil {
			return err
		}
		cfgs[i].Config = v
	}
	return nil
}

// configTarget returns the index of the plugin a --config value is for and
// the file, or -1.
func configTarget(v string, cfgs []hooks.Config) (int, string) {
	if n, p, ok := strings.Cut(v, "="); ok {
		for i, c := range cfgs {
			if c.Name == n {
				return i, p
			}
		}
	}
	if len(cfgs) == 1 {
		return 0, v
	}
	return -1, ""
}

// names lists the plugins' names, in order.
func names(cfgs []hooks.Config) []string {
	out := make([]string, len(cfgs))
	for i, c := range cfgs {
		out[i] = c.Name
	}
	return out
}

// readPluginConfig reads a plugin's config value from its YAML file.
func readPluginConfig(path string) (any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// run plans the manifests, applies the chain, prints the result and checks
// it: against the plugins' failures, then the --expect file.
func (t pluginTest) run(stdout io.Writer, log *slog.Logger, cfgs []hooks.Config) error {
	ctx, cancel := signalContext()
	defer cancel()
	planned, err := t.plan(ctx, log)
	if err != nil {
		return err
	}
	var src hooks.SignalSource
	if t.signals != "" {
		if src, err = readSignals(t.signals); err != nil {
			return err
		}
	}
	res, err := applyChain(ctx, cfgs, hooks.Options{CacheDir: t.cacheDir}, log, planned, src)
	if err != nil {
		return err
	}
	report := beforeAfter(names(cfgs), res.in, res.out, res.changes) + failureText(res.failures)
	if _, err := io.WriteString(stdout, report); err != nil {
		return err
	}
	if err := joinFailures(res.failures); err != nil {
		return err
	}
	if t.expect == "" {
		return nil
	}
	got := goldenText(names(cfgs), res.out)
	if t.update {
		return writeGolden(stdout, t.expect, got)
	}
	return compareGolden(t.expect, got)
}

// plan returns the planner's plan of the manifests for the node.
func (t pluginTest) plan(ctx context.Context, log *slog.Logger) (*plan.Plan, error) {
	p := proxy.New(proxy.Options{NodeName: t.nodeName, Log: slog.New(slog.DiscardHandler)})
	if err := p.LoadOnce(ctx, files.New(t.manifests, log)); err != nil {
		return nil, fmt.Errorf("manifests %s: %w", t.manifests, err)
	}
	if err := p.Sync(ctx, true); err != nil {
		return nil, err
	}
	return p.Planned(), nil
}

// chainResult is what one pass of the chain over a plan gave.
type chainResult struct {
	in, out  []*plan.Service
	changes  []change
	failures []pluginFailure
}

// applyChain loads the plugins and runs every service of planned through
// them once, as a full sync does; with signals, it then runs the services
// whose signals are not zero through them again, as weir run does after
// reading the signals.
func applyChain(ctx context.Context, cfgs []hooks.Config, opts hooks.Options, log *slog.Logger,
	planned *plan.Plan, signals hooks.SignalSource) (*chainResult, error) {
	var res chainResult
	opts.OnChange = func(plugin string, before, after *plan.Service) {
		res.changes = append(res.changes, change{plugin, before, after})
	}
	opts.Log = log
	chain, err := hooks.New(ctx, cfgs, opts)
	if err != nil {
		return nil, err
	}
	res.failures = loadFailures(chain)
	defer closeChain(chain)
	keys := planned.Keys()
	res.in = make([]*plan.Service, len(keys))
	for i, k := range keys {
		res.in[i] = planned.Services[k]
	}
	out, err := chain.Apply(ctx, planned.Node, res.in, true)
	res.out = out
	res.failures = append(res.failures, pluginFailures(err)...)
	if signals != nil && err == nil {
		if err := res.applySignals(ctx, chain, planned.Node, signals); err != nil {
			return nil, err
		}
	}
	return &res, nil
}

// applySignals has the chain read signals and runs the services whose
// signals moved through it again, in place of their first pass.
func (res *chainResult) applySignals(ctx context.Context, chain *hooks.Chain, node plan.Node, signals hooks.SignalSource) error {
	keys, err := chain.Poll(ctx, signals)
	if err != nil || len(keys) == 0 {
		return err
	}
	moved := map[plan.Key]bool{}
	for _, k := range keys {
		moved[k] = true
	}
	res.changes = slices.DeleteFunc(res.changes, func(c change) bool { return moved[c.before.Key] })
	var idx []int
	var again []*plan.Service
	for i, s := range res.in {
		if moved[s.Key] {
			idx, again = append(idx, i), append(again, s)
		}
	}
	out, err := chain.Apply(ctx, node, again, false)
	for j, i := range idx {
		res.out[i] = out[j]
	}
	res.failures = append(res.failures, pluginFailures(err)...)
	return nil
}

// beforeAfter renders every service as a unified diff of its plan before
// and after the chain, says which plugin changed which lines when there
// are several, then counts.
func beforeAfter(plugins []string, in, out []*plan.Service, changes []change) string {
	var b strings.Builder
	byKey := map[plan.Key][]change{}
	for _, c := range changes {
		byKey[c.before.Key] = append(byKey[c.before.Key], c)
	}
	chain := strings.Join(plugins, ", ")
	changed := 0
	for i, s := range in {
		if s.Equal(out[i]) {
			fmt.Fprintf(&b, "= %s unchanged\n", s.Key)
			continue
		}
		changed++
		fmt.Fprintf(&b, "--- %s before %s\n+++ %s after %s\n", s.Key, chain, s.Key, chain)
		for _, l := range lineDiff(serviceLines(s), serviceLines(out[i])) {
			b.WriteString(string(l.op) + l.text + "\n")
		}
		if out[i] == nil {
			b.WriteString("  # no rules: a closed plugin failed and there are no last good ones\n")
		}
		if len(plugins) > 1 {
			writeChanges(&b, byKey[s.Key])
		}
	}
	fmt.Fprintf(&b, "%s changed %d of %d services\n", chain, changed, len(in))
	return b.String()
}

// writeChanges writes, as comments, the lines each plugin changed.
func writeChanges(b *strings.Builder, changes []change) {
	for _, c := range changes {
		b.WriteString("  # plugin " + c.plugin + " changed:\n")
		for _, l := range lineDiff(serviceLines(c.before), serviceLines(c.after)) {
			if l.op != ' ' {
				b.WriteString("  #   " + string(l.op) + " " + strings.TrimSpace(l.text) + "\n")
			}
		}
	}
}

// pluginFailures returns the plugin failures an Apply error holds.
func pluginFailures(err error) []pluginFailure {
	if err == nil {
		return nil
	}
	var out []pluginFailure
	for _, e := range unjoin(err) {
		var pe *hooks.PluginError
		if errors.As(e, &pe) {
			out = append(out, pluginFailure{plugin: pe.Plugin, err: pe})
		} else {
			out = append(out, pluginFailure{err: e})
		}
	}
	return out
}

// unjoin returns the errors errors.Join joined, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// fileSignals are the live signals of a --signals file, by endpoint.
type fileSignals map[netip.AddrPort]abi.Signals

// readSignals reads a --signals file: a YAML mapping of ADDRESS:PORT to
// {active: N, new: N}.
func readSignals(path string) (fileSignals, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]struct {
		Active uint32 `json:"active"`
		New    uint32 `json:"new"`
	}
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w (want ADDRESS:PORT: {active: N, new: N} lines)", path, err)
	}
	out := fileSignals{}
	for k, v := range raw {
		ap, err := netip.ParseAddrPort(k)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not ADDRESS:PORT: %w", path, k, err)
		}
		out[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = abi.Signals{Active: v.Active, New: v.New}
	}
	return out, nil
}

// Signals gives every endpoint the signals of its address and port.
func (f fileSignals) Signals(_ context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	out := make([][]abi.Signals, len(services))
	for i, s := range services {
		out[i] = make([]abi.Signals, len(s.Endpoints))
		for j, e := range s.Endpoints {
			out[i][j] = f[netip.AddrPortFrom(e.Address.Unmap(), e.Port)]
		}
	}
	return out, nil
}
