package backends

import (
	"log/slog"
	"net/netip"
)

// Common holds the options every kernel backend shares.
type Common struct {
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
	// Log receives the backend's messages; slog.Default() when nil.
	Log *slog.Logger
}

// LocalDetector says how traffic from pods is recognised.
type LocalDetector string

// The ways of recognising pod traffic.
const (
	// DetectClusterCIDR recognises sources inside ClusterCIDRs (none when it
	// is empty).
	DetectClusterCIDR LocalDetector = "ClusterCIDR"
	// DetectNodeCIDR recognises sources inside the plan node's PodCIDRs.
	// Until the node's podCIDRs are known, all cluster-IP traffic is
	// masqueraded.
	DetectNodeCIDR LocalDetector = "NodeCIDR"
	// DetectInterfaceNamePrefix recognises packets arriving on an interface
	// whose name starts with PodInterfacePrefix.
	DetectInterfaceNamePrefix LocalDetector = "InterfaceNamePrefix"
)

// LocalDetectors lists every LocalDetector, by the names kube-proxy's
// detectLocalMode gives them too.
var LocalDetectors = []LocalDetector{DetectClusterCIDR, DetectNodeCIDR, DetectInterfaceNamePrefix}

// Detector returns the effective local detector: DetectClusterCIDR when
// LocalDetector is empty.
func (c *Common) Detector() LocalDetector {
	if c.LocalDetector == "" {
		return DetectClusterCIDR
	}
	return c.LocalDetector
}

// Logger returns Log, or slog.Default() when Log is nil.
func (c *Common) Logger() *slog.Logger {
	if c.Log == nil {
		return slog.Default()
	}
	return c.Log
}
