package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/iptables"
	"github.com/weirproxy/weir/backends/ipvs"
	"github.com/weirproxy/weir/backends/nftables"
	"github.com/weirproxy/weir/core/config"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/metrics"
	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/runner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/source/files"
	"github.com/weirproxy/weir/core/source/kubernetes"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/internal/kernelver"
	"github.com/weirproxy/weir/sdk/plan"
)

// errUsage marks errors in how the command was invoked.
var errUsage = errors.New("usage error")

// environment is what every command gets: its configuration, log and flags.
type environment struct {
	cfg    *config.Config
	log    *slog.Logger
	flags  *pflag.FlagSet
	stdout io.Writer
}

func setup(cmd *command, args []string, stdout, stderr io.Writer) (*environment, error) {
	fs := pflag.NewFlagSet("weir "+cmd.name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	config.RegisterFlags(fs)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 && !cmd.takesArgs {
		return nil, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	cfg, err := config.Load(fs, os.Environ())
	if err != nil {
		return nil, err
	}
	log := newLogger(cfg.Log, stderr)
	for _, w := range cfg.Warnings {
		log.Warn("Ignoring a KubeProxyConfiguration field", "field", w)
	}
	for _, w := range cfg.Ineffective {
		log.Warn("A setting has no effect", "setting", w)
	}
	return &environment{cfg: cfg, log: log, flags: fs, stdout: stdout}, nil
}

func newLogger(c config.LogConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func newSource(env *environment) (source.Source, error) {
	switch env.cfg.Source.Kind {
	case "files":
		return files.New(env.cfg.Source.Path, env.log), nil
	case "kubernetes":
		kubernetes.RouteClientLogs(env.log)
		rc, err := kubernetes.Config(env.cfg.Source.Kubeconfig)
		if err != nil {
			return nil, err
		}
		return kubernetes.New(rc, kubernetes.Options{NodeName: env.cfg.NodeName, Log: env.log})
	}
	return nil, fmt.Errorf("source.kind %q is unknown; use files or kubernetes", env.cfg.Source.Kind)
}

// closingBackend is a backend that holds a kernel handle.
type closingBackend interface {
	backends.Backend
	Close() error
}

func newBackend(env *environment) (closingBackend, error) {
	cfg := env.cfg
	common := backends.Common{
		ClusterCIDRs:  cfg.ClusterCIDRs,
		MasqueradeAll: cfg.MasqueradeAll,
		LocalDetector: cfg.LocalDetector.Mode,
		// Named like kube-proxy's --pod-interface-name-prefix.
		PodInterfacePrefix: cfg.LocalDetector.InterfaceNamePrefix,
		NodePortCIDRs:      cfg.NodePortAddresses.CIDRs,
		NodePortPrimary:    cfg.NodePortAddresses.Primary,
		LocalhostNodePorts: cfg.LocalhostNodePorts,
		Log:                env.log,
	}
	switch cfg.Mode {
	case "nftables":
		return nftables.New(nftables.Options{Common: common, Table: cfg.NFTables.Table, PlainBuckets: !cfg.NFTables.CommentBuckets})
	case "iptables":
		be, err := iptables.New(iptables.Options{Common: common, Flavour: cfg.IPTables.Backend, KeepInvalid: cfg.Conntrack.TCPBeLiberal})
		if err != nil {
			return nil, err
		}
		env.log.Info("Using iptables", "flavour", be.Flavour())
		return be, nil
	case "ipvs":
		be, err := ipvs.New(ipvs.Options{
			Common:      common,
			Scheduler:   cfg.IPVS.Scheduler,
			Interface:   cfg.IPVS.Interface,
			StrictARP:   cfg.IPVS.StrictARP,
			GracePeriod: cfg.IPVS.GracePeriod,
			// The masquerade rules are written with iptables.backend's flavour.
			Flavour:       cfg.IPTables.Backend,
			NodePortRange: [2]uint16{cfg.NodePortRange.First, cfg.NodePortRange.Last},
		})
		// Without IPVS in the kernel (after moby/ipvs tried to load ip_vs)
		// New may fail on the missing netlink family, or succeed and leave
		// every sync to fail: either way, say why.
		if !ipvsInKernel() {
			if err == nil {
				be.Close()
			}
			return nil, fmt.Errorf("mode ipvs: this kernel has no IPVS (no %s): load the ip_vs module, or use mode nftables or iptables", procIPVS)
		}
		if err != nil {
			return nil, err
		}
		env.log.Info("Using IPVS", "scheduler", cfg.IPVS.Scheduler, "interface", cfg.IPVS.Interface,
			"iptablesBackend", cfg.IPTables.Backend, "flavour", be.Flavour())
		return be, nil
	}
	return nil, fmt.Errorf("mode %q is unknown; use nftables, iptables or ipvs", cfg.Mode)
}

// procIPVS exists in every network namespace while the kernel has IPVS.
const procIPVS = "/proc/net/ip_vs"

func ipvsInKernel() bool {
	_, err := os.Stat(procIPVS)
	return err == nil
}

// signalContext is cancelled by the first SIGINT or SIGTERM, with the
// signal as its cause. A second signal ends the process at once, as Go
// does by default, should stopping ever hang.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

func runDaemon(env *environment) error {
	src, err := newSource(env)
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	ev, stopEvents, err := nodeEvents(env)
	if err != nil {
		return err
	}
	defer stopEvents()
	dbg := newDebugServer(env.cfg.Mode, env.cfg.NodeName)
	m := observed{Metrics: metrics.New(env.cfg.Mode), ev: ev, debug: dbg}
	// Like kube-proxy: unhealthy when a change waited two sync periods.
	ph := health.NewProxy(health.ProxyOptions{Timeout: 2 * env.cfg.SyncPeriod, Observe: m.Probe})
	stop, err := serve(env, "healthzBindAddress", env.cfg.HealthzBindAddress, ph.Handler())
	if err != nil {
		return err
	}
	defer stop()
	mh := dbg.handler(m.Handler())
	if env.cfg.EnableProfiling {
		mh = withProfiling(mh)
	}
	stop, err = serve(env, "metricsBindAddress", env.cfg.MetricsBindAddress, mh)
	if err != nil {
		return err
	}
	defer stop()
	// The source lists its objects while the backend and the plugins load:
	// a restart's first sync comes that much sooner.
	prefetched := source.Prefetch(ctx, src)
	reloaded := make(chan struct{}, 1)
	be, chain, err := loadBackendAndChain(ctx, env, hooks.Options{Observer: m, OnReload: func() {
		select {
		case reloaded <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		return err
	}
	defer be.Close()
	defer closeChain(chain)
	hc := health.NewServers(health.Options{Log: env.log, Healthy: ph.Healthy})
	defer hc.Close()
	ct, err := conntrack.New(0, env.log)
	if err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	defer ct.Close()
	setConntrack(env)
	var pm proxy.Metrics = m
	if env.cfg.Takeover {
		pm = takingOver{observed: m, t: &takeover{env: env, be: be}}
	}
	opts := proxy.Options{NodeName: env.cfg.NodeName, Backend: be, HealthChecks: hc, Conntrack: ct,
		Health: ph, Metrics: pm, NodePorts: nodePorts(env), ServiceCIDRs: env.cfg.ServiceCIDRs, Log: env.log}
	if chain != nil {
		opts.Hooks = chain
	}
	p := proxy.New(opts)
	dbg.proxy.Store(p)
	if chain != nil {
		dbg.chain.Store(chain)
		go watchPlugins(ctx, env, chain, reloaded, p)
		if chain.SignalInterval() > 0 {
			go pollSignals(ctx, env, chain, signalSource(be, ct), p, m)
		}
	}
	env.log.Info("Starting Weir", "version", version, "mode", env.cfg.Mode, "node", env.cfg.NodeName,
		"source", env.cfg.Source.Kind, "path", env.cfg.Source.Path, "plugins", len(env.cfg.Plugins),
		"nodePortAddresses", env.cfg.NodePortAddresses.String(), "localhostNodePorts", env.cfg.LocalhostNodePorts)
	if err := kernelver.Supported(); err != nil {
		env.log.Warn("This kernel is not one Weir supports; it may refuse or mis-handle rules", "error", err,
			"minimum", kernelver.Minimum)
	}
	err = p.Run(ctx, prefetched, runner.Options{MinInterval: env.cfg.MinSyncPeriod, MaxInterval: env.cfg.SyncPeriod})
	env.log.Info("Stopping Weir; the rules stay in place")
	return err
}

// setConntrack sets the connection-tracking parameters of the conntrack
// section, as kube-proxy does at start. One that cannot be set (in a
// network namespace other than the initial one nf_conntrack_max is
// read-only) is a warning, not a reason to leave the node without rules.
func setConntrack(env *environment) {
	c := env.cfg.Conntrack
	s := conntrack.Settings{Max: conntrack.MaxFor(c.MaxPerCore, c.Min, conntrack.CPUs()),
		TCPEstablishedTimeout: c.TCPEstablishedTimeout, TCPCloseWaitTimeout: c.TCPCloseWaitTimeout,
		UDPTimeout: c.UDPTimeout, UDPStreamTimeout: c.UDPStreamTimeout, TCPBeLiberal: c.TCPBeLiberal}
	for _, err := range conntrack.Apply(0, s) {
		env.log.Warn("Cannot set a connection-tracking parameter; the kernel keeps its own", "error", err)
	}
}

// loadBackendAndChain creates the backend and loads the plugins at the
// same time (a flavour detection and compiled plugins each take a few
// hundred milliseconds); on failure it closes whichever of them succeeded.
func loadBackendAndChain(ctx context.Context, env *environment, opts hooks.Options) (closingBackend, *hooks.Chain, error) {
	var be closingBackend
	var beErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		be, beErr = newBackend(env)
	}()
	chain, err := newChain(ctx, env, opts)
	<-done
	if err == nil && beErr == nil {
		return be, chain, nil
	}
	if beErr == nil {
		be.Close()
	}
	if err == nil {
		closeChain(chain)
	}
	return nil, nil, errors.Join(beErr, err)
}

func syncFlags(fs *pflag.FlagSet) {
	fs.Bool("once", false, "sync once and exit (required)")
	loadFlags(fs)
}

// defaultLoadTimeout is how long plan and sync --once wait for the source's
// objects and the plugins unless --timeout says otherwise: long enough for
// an API server that restarts, short enough for a script to notice.
const defaultLoadTimeout = time.Minute

// loadFlags adds --timeout to the commands that load the source once.
func loadFlags(fs *pflag.FlagSet) {
	fs.Duration("timeout", defaultLoadTimeout,
		"give up when the source's objects and the plugins are not loaded after this long (a commit under way is not cut short)")
}

// loading returns the context that bounds how long a one-shot command
// loads the source and the plugins: it ends --timeout from now, with a
// cause that names the flag.
func loading(ctx context.Context, env *environment) (context.Context, context.CancelFunc, error) {
	timeout, _ := env.flags.GetDuration("timeout")
	if timeout <= 0 {
		return nil, nil, fmt.Errorf("%w: --timeout %v: want a positive duration", errUsage, timeout)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("gave up after --timeout %v", timeout))
	return ctx, cancel, nil
}

func runSync(env *environment) error {
	if once, _ := env.flags.GetBool("once"); !once {
		return fmt.Errorf("%w: weir sync needs --once (use weir run for the daemon)", errUsage)
	}
	be, err := newBackend(env)
	if err != nil {
		return err
	}
	defer be.Close()
	ctx, cancel := signalContext()
	defer cancel()
	load, cancelLoad, err := loading(ctx, env)
	if err != nil {
		return err
	}
	defer cancelLoad()
	chain, err := newChain(load, env, hooks.Options{})
	if err != nil {
		return err
	}
	defer closeChain(chain)
	p, err := loadedProxy(load, env, be, chain)
	if err != nil {
		return err
	}
	if err := p.Sync(ctx, true); err != nil {
		return err
	}
	if err := p.PluginFailures(); err != nil {
		return fmt.Errorf("rules committed, but hook plugins failed (their failure policies applied): %w", err)
	}
	return nil
}

// nodePorts is the configured nodePortRange in the planner's terms.
func nodePorts(env *environment) planner.PortRange {
	r := env.cfg.NodePortRange
	return planner.PortRange{First: r.First, Last: r.Last}
}

// runPlan prints the plan after the plugins, touching no kernel. A plugin
// that failed (did not load, or failed a call) is marked in the output
// with a "! FAILED plugin" line, and the command then fails.
func runPlan(env *environment) error {
	ctx, cancel := signalContext()
	defer cancel()
	load, cancelLoad, err := loading(ctx, env)
	if err != nil {
		return err
	}
	defer cancelLoad()
	var changes []change
	chain, err := newChain(load, env, hooks.Options{OnChange: func(plugin string, before, after *plan.Service) {
		changes = append(changes, change{plugin, before, after})
	}})
	if err != nil {
		return err
	}
	failures := loadFailures(chain)
	defer closeChain(chain)
	p, err := loadedProxy(load, env, nil, chain)
	if err != nil {
		return err
	}
	if err := p.Sync(ctx, true); err != nil {
		return err
	}
	failures = append(failures, pluginFailures(p.PluginFailures())...)
	if _, err := io.WriteString(env.stdout, planText(p.Plan(), changes)+failureText(failures)); err != nil {
		return err
	}
	// The plan printed is what the failure policies made of the failures.
	return joinFailures(failures)
}

// loadedProxy returns a proxy that has read the source's current objects.
// A nil chain runs no plugins; the proxy closes nothing it is given.
func loadedProxy(ctx context.Context, env *environment, be backends.Backend, chain *hooks.Chain) (*proxy.Proxy, error) {
	src, err := newSource(env)
	if err != nil {
		return nil, err
	}
	opts := proxy.Options{NodeName: env.cfg.NodeName, Backend: be, NodePorts: nodePorts(env), ServiceCIDRs: env.cfg.ServiceCIDRs, Log: env.log}
	if chain != nil {
		opts.Hooks = chain
	}
	p := proxy.New(opts)
	if err := p.LoadOnce(ctx, src); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", err, cause)
		}
		return nil, fmt.Errorf("source %s: %w", env.cfg.Source.Kind, err)
	}
	return p, nil
}

// cleanupTargets are the modes, and flavours of iptables, runCleanup
// cleans. The IPVS backend removes its iptables rules in both flavours
// itself.
var cleanupTargets = []struct{ mode, flavour string }{
	{"nftables", ""},
	{"iptables", "legacy"}, {"iptables", "nft"},
	{"ipvs", ""},
}

// runCleanup removes Weir's rules from every mode, and kube-proxy's, like
// kube-proxy's --cleanup, so that switching modes leaves nothing behind;
// with --keep-kube-proxy it is the hand-back to kube-proxy instead, which
// removes only Weir's own state of every mode (see handBackTarget).
func runCleanup(env *environment) error {
	if keep, _ := env.flags.GetBool(keepKubeProxyFlag); keep {
		return everyTarget(env, handBackTarget, "")
	}
	return everyTarget(env, cleanupTarget, "Removed Weir's rules")
}

// everyTarget runs pass for each of cleanupTargets and logs done for each
// that succeeded (nothing when done is empty). Only a failure in the
// configured mode fails the command: with iptables.backend nft or legacy,
// that flavour's; with auto, a failure of every flavour. The others, such
// as mode ipvs on a host without the ip_vs module, are logged.
func everyTarget(env *environment, pass func(env *environment, mode, flavour string) error, done string) error {
	errs := make([]error, len(cleanupTargets))
	skip := env.cfg.Mode != "ipvs" && !ipvsInKernel()
	if skip {
		// No IPVS, no virtual servers; and cleaning up would try to load
		// the ip_vs module on a node that may never have used it.
		env.log.Info("Skipping mode ipvs: this kernel has no IPVS", "missing", procIPVS)
	}
	for i, m := range cleanupTargets {
		if m.mode == "ipvs" && skip {
			errs[i] = errSkipped
			continue
		}
		errs[i] = pass(env, m.mode, m.flavour)
	}
	return targetErrors(env, errs, done)
}

// targetErrors logs done for each of cleanupTargets without an error (in
// errs, by index), logs the errors of the targets not in use, and returns
// those of the configured mode (see everyTarget).
func targetErrors(env *environment, errs []error, done string) error {
	var failed error
	seen := map[string]bool{} // two flavours of a mode often fail alike
	for i, m := range cleanupTargets {
		err := errs[i]
		configured := m.mode == env.cfg.Mode && (m.flavour == "" || env.cfg.IPTables.Backend == m.flavour ||
			(env.cfg.IPTables.Backend == "auto" && !succeeded(errs, m.mode)))
		switch {
		case errors.Is(err, errSkipped):
		case err == nil:
			if done != "" {
				env.log.Info(done, "mode", m.mode, "flavour", m.flavour)
			}
		case configured:
			if !seen[err.Error()] {
				seen[err.Error()] = true
				failed = errors.Join(failed, err)
			}
		default:
			env.log.Warn("Could not clean up a mode or flavour not in use", "mode", m.mode, "flavour", m.flavour, "error", err)
		}
	}
	return failed
}

// errSkipped marks a cleanup pass that did not run.
var errSkipped = errors.New("skipped")

// succeeded reports whether some pass of mode has no error.
func succeeded(errs []error, mode string) bool {
	for i, m := range cleanupTargets {
		if m.mode == mode && errs[i] == nil {
			return true
		}
	}
	return false
}

// cleanupTarget removes the rules of one mode, with one iptables flavour
// when the mode has any, whatever env's mode is.
func cleanupTarget(env *environment, mode, flavour string) error {
	return cleanupMode(envFor(env, mode, flavour))
}

// envFor returns env with mode and, when not empty, the iptables flavour
// in place of its own.
func envFor(env *environment, mode, flavour string) *environment {
	cfg := *env.cfg
	cfg.Mode = mode
	if flavour != "" {
		cfg.IPTables.Backend = flavour
	}
	return &environment{cfg: &cfg, log: env.log, flags: env.flags, stdout: env.stdout}
}

// cleanupMode removes the rules of env's configured mode.
func cleanupMode(env *environment) error {
	be, err := newBackend(env)
	if err != nil {
		return err
	}
	defer be.Close()
	return be.Cleanup(context.Background())
}
