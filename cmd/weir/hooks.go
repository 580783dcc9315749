package main

import (
	"context"
	"fmt"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/hooks"
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
