package iptables

import (
	"time"

	"github.com/weirproxy/weir/backends"
)

// Options configures the iptables backend.
type Options struct {
	backends.Common
	// Flavour selects the iptables binaries: "auto" (or empty) detects the
	// flavour already in use like kube-proxy's iptables-wrapper, "nft" or
	// "legacy" forces one. It shapes the restore texts: with "legacy" they
	// declare chains in descending name order.
	Flavour string
	// RewritePeriod is the longest time between two syncs that rewrite every
	// chain; 0 means an hour, kube-proxy's full-sync period. A full sync
	// asked for sooner writes only what differs from what the backend wrote
	// (see Backend.Sync). A failed restore, and damage the periodic look at
	// the tables finds (look.go), always lead to a rewrite.
	RewritePeriod time.Duration
	// KeepInvalid leaves alone forwarded packets conntrack calls invalid;
	// by default KUBE-FORWARD drops them, as kube-proxy does unless
	// conntrack.tcpBeLiberal is set (an out-of-window packet would
	// otherwise reach a pod un-NATed and be answered with a reset).
	KeepInvalid bool
}

// defaultRewritePeriod is RewritePeriod's default.
const defaultRewritePeriod = time.Hour

// rewritePeriod returns the effective RewritePeriod.
func (o *Options) rewritePeriod() time.Duration {
	if o.RewritePeriod <= 0 {
		return defaultRewritePeriod
	}
	return o.RewritePeriod
}
