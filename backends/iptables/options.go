package iptables

import (
	"log/slog"
	"net/netip"
	"time"
)

// Options configures the iptables backend.
type Options struct {
	// Flavour selects the iptables binaries: "auto" (or empty) detects the
	// flavour already in use like kube-proxy's iptables-wrapper, "nft" or
	// "legacy" forces one. It shapes the restore texts: with "legacy" they
	// declare chains in descending name order.
	Flavour string
	// NetNS, when non-zero, is a file descriptor of the network namespace to
	// program instead of the caller's own.
	NetNS int
	// ClusterCIDRs selects cluster-internal sources; cluster-IP traffic from
	// elsewhere is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all cluster-IP traffic.
	MasqueradeAll bool
	// LocalDetector says how pod traffic is recognised; cluster-IP traffic
	// from anything else is masqueraded. Empty means DetectClusterCIDR.
	LocalDetector LocalDetector
	// PodInterfacePrefix is the pod interface name prefix for
	// DetectInterfaceNamePrefix.
	PodInterfacePrefix string
	// NodePortCIDRs limits node ports to local addresses in these ranges;
	// empty means every local address except loopback.
	NodePortCIDRs []netip.Prefix
	// NodePortPrimary limits node ports to the plan node's addresses (the
	// Node object's InternalIP and ExternalIP), following its changes.
	NodePortPrimary bool
	// LocalhostNodePorts also accepts node ports on 127.0.0.0/8 (when
	// NodePortCIDRs is empty): the first sync sets route_localnet, and
	// packets to loopback addresses from elsewhere are dropped.
	LocalhostNodePorts bool
	// RewritePeriod is the longest time between two syncs that rewrite every
	// chain; 0 means an hour, kube-proxy's full-sync period. A full sync
	// asked for sooner writes only what differs from what the backend wrote
	// (see Backend.Sync). Failed syncs and missing jump rules always lead
	// to a rewrite.
	RewritePeriod time.Duration
	// Log receives the backend's messages; slog.Default() when nil.
	Log *slog.Logger
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

// LocalDetector says how traffic from pods is recognised.
type LocalDetector string

// The ways of recognising pod traffic.
const (
	// DetectClusterCIDR: sources inside ClusterCIDRs (none when it is empty).
	DetectClusterCIDR LocalDetector = "ClusterCIDR"
	// DetectNodeCIDR: sources inside the plan node's PodCIDRs. Until the
	// node's podCIDRs are known, all cluster-IP traffic is masqueraded.
	DetectNodeCIDR LocalDetector = "NodeCIDR"
	// DetectInterfaceNamePrefix: packets arriving on an interface whose name
	// starts with PodInterfacePrefix.
	DetectInterfaceNamePrefix LocalDetector = "InterfaceNamePrefix"
)

// detector returns the effective local detector (DetectClusterCIDR when
// unset).
func (o *Options) detector() LocalDetector {
	if o.LocalDetector == "" {
		return DetectClusterCIDR
	}
	return o.LocalDetector
}

// logger returns the configured logger or slog.Default().
func (o *Options) logger() *slog.Logger {
	if o.Log == nil {
		return slog.Default()
	}
	return o.Log
}
