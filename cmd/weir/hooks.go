package main

import (
	"context"
	"fmt"
	"time"

	"github.com/weirproxy/weir/backends/ipvs"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// newChain loads the configured plugins; nil when there are none.
func newChain(ctx context.Context, env *environment, opts hooks.Options) (*hooks.Chain, error) {
	if len(env.cfg.Plugins) == 0 {
		return nil, nil
	}
	opts.CacheDir = env.cfg.Hooks.CacheDir
	opts.Log = env.log
	chain, err := hooks.New(ctx, env.cfg.Plugins, opts)
	if err != nil {
		return nil, fmt.Errorf("plugins: %w", err)
	}
	return chain, nil
}

// watchPlugins reloads changed plugin files until ctx is done; every
// reload makes the next sync a full one, so all services pass the new
// version.
func watchPlugins(ctx context.Context, env *environment, chain *hooks.Chain, reloaded <-chan struct{}, p *proxy.Proxy) {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-reloaded:
				p.RequestFullSync()
			}
		}
	}()
	if err := chain.Watch(ctx); err != nil {
		env.log.Error("Stopped watching plugin files; changes need a restart", "error", err)
	}
}

// pollSignals reads, every interval of the plugins with signals, the
// signals of the services they saw, and has the proxy run the services
// whose signals moved through the plugins again, until ctx is done. A read
// that fails is logged when it starts failing and when it recovers.
func pollSignals(ctx context.Context, env *environment, chain *hooks.Chain, src hooks.SignalSource, p *proxy.Proxy,
	rec signalRecorder) {
	t := time.NewTicker(chain.SignalInterval())
	defer t.Stop()
	src = recordedSource{SignalSource: src, rec: rec}
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keys, err := chain.Poll(ctx, src)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				env.log.Warn("Cannot read the plugins' live signals; their weights stay as they are", "error", err)
			}
			failing = true
			continue
		case failing:
			env.log.Info("Reading the plugins' live signals again")
			failing = false
		}
		if len(keys) > 0 {
			env.log.Debug("Live signals moved", "services", len(keys))
			rec.SignalsMoved(len(keys))
			p.Touch(keys...)
		}
	}
}

// signalRecorder records the readings of the live signals and the
// services whose signals moved; *metrics.Metrics is one.
type signalRecorder interface {
	SignalsRead(took time.Duration, err error)
	SignalsMoved(services int)
}

// recordedSource records each reading of its SignalSource: only the ticks
// on which a plugin was due read it.
type recordedSource struct {
	hooks.SignalSource
	rec signalRecorder
}

// Signals reads the wrapped source and records how long it took and
// whether it failed, unless ctx ended it.
func (s recordedSource) Signals(ctx context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	start := time.Now()
	sigs, err := s.SignalSource.Signals(ctx, services)
	if ctx.Err() == nil {
		s.rec.SignalsRead(time.Since(start), err)
	}
	return sigs, err
}

// signalSource is where the plugins' live signals come from: IPVS's own
// counts in IPVS mode, the conntrack table in the other modes.
func signalSource(be any, ct *conntrack.Cleaner) hooks.SignalSource {
	if src, ok := be.(hooks.SignalSource); ok {
		return src
	}
	return conntrack.NewLoad(ct, conntrack.Limits{})
}

// change is one plugin's edit of one service, for weir plan.
type change struct {
	plugin        string
	before, after *plan.Service
}

// closeChain releases the plugins' runtimes; nil is fine.
func closeChain(c *hooks.Chain) {
	if c != nil {
		_ = c.Close(context.Background())
	}
}

// The IPVS backend is the signal source of mode ipvs.
var _ hooks.SignalSource = (*ipvs.Backend)(nil)
