package main

import (
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/metrics"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/hooks"
)

// The implementations the wiring hands to the proxy, checked against its
// interfaces at compile time: a changed method set fails the build here,
// next to the wiring, instead of at the one call that passes it.
var (
	_ proxy.Hooks        = (*hooks.Chain)(nil)
	_ proxy.Conntrack    = (*conntrack.Cleaner)(nil)
	_ proxy.HealthChecks = (*health.Servers)(nil)
	_ proxy.Metrics      = (*metrics.Metrics)(nil)
	_ proxy.Metrics      = observed{}
	_ proxy.Metrics      = takingOver{}
)
