// Package config loads Weir's configuration from defaults, a YAML file, WEIR_*
// environment variables and command-line flags.
//
// Each layer overrides the one before it:
//
//	defaults < YAML file (--config or WEIR_CONFIG) < WEIR_* environment < flags
//
// Only flags the user actually set on the command line take part; a flag left
// at its default never hides a value from the file or the environment.
//
// Load validates every key and is strict: an unknown key anywhere in the YAML
// file, or an unknown WEIR_* environment variable, is an error, so a typo never
// silently falls back to a default. Every error Load returns is either an
// *Error or an errors.Join of several *Error values, one per bad key; use
// errors.As to inspect the first. The command (cmd/weir) treats any of them as
// a usage error and exits with status 2.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/hooks"
)

// Config is the complete, validated configuration of one Weir process.
type Config struct {
	// Mode selects the kernel backend: "nftables", "iptables" or "ipvs".
	Mode string
	// NodeName is the name of the Node object this proxy runs for, in lower case.
	NodeName string
	// Source says where Services, EndpointSlices and Nodes come from.
	Source SourceConfig
	// ClusterCIDRs are the pod network ranges; traffic from outside them to a
	// cluster IP is masqueraded. Nil when unset.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are ranges cluster IPs are allocated from, added to those
	// of the cluster's ServiceCIDR objects: in mode nftables, traffic to an
	// unallocated address in them is dropped. Nil when unset.
	ServiceCIDRs []netip.Prefix
	// LocalDetector says how traffic from this cluster's pods is recognised,
	// which decides what cluster-IP traffic is masqueraded.
	LocalDetector LocalDetectorConfig
	// MasqueradeAll masquerades (SNATs) all traffic sent to a service IP.
	MasqueradeAll bool
	// LocalhostNodePorts accepts NodePort connections to 127.0.0.1 (IPv4)
	// when NodePortAddresses is every local address, which needs
	// net.ipv4.conf.all.route_localnet=1. Unset, it follows the mode as
	// kube-proxy's does: on in modes iptables and ipvs (which ignores it),
	// off in mode nftables.
	LocalhostNodePorts bool
	// NodePortAddresses selects the node addresses that accept NodePort
	// traffic. Unset, it follows the mode as kube-proxy's does: the
	// primary IPs in mode nftables, every local address in the others.
	NodePortAddresses NodePortAddresses
	// NodePortRange is the range node ports (and health check node ports)
	// must lie in, the API server's --service-node-port-range; ports
	// outside it are skipped with a warning.
	NodePortRange PortRange
	// Takeover removes what kube-proxy left on the node, in every mode,
	// once Weir's first commit serves the services: switching from
	// kube-proxy needs no reboot and no manual cleanup.
	Takeover bool
	// SyncPeriod is the longest time between two full syncs of kernel state.
	SyncPeriod time.Duration
	// MinSyncPeriod is the shortest time between two syncs, however fast
	// changes arrive; zero syncs on every change.
	MinSyncPeriod time.Duration
	// MetricsBindAddress is the IP:port of the metrics server; empty
	// disables it.
	MetricsBindAddress string
	// HealthzBindAddress is the IP:port of the /healthz and /livez server;
	// empty disables it.
	HealthzBindAddress string
	// EnableProfiling serves Go's profiles (net/http/pprof) under
	// /debug/pprof/ on the metrics server, as kube-proxy's enableProfiling.
	EnableProfiling bool
	// Log configures the process log.
	Log LogConfig
	// NFTables holds settings used only by the nftables backend.
	NFTables NFTablesConfig
	// IPTables holds settings of the iptables backend; its Backend also
	// picks the iptables flavour of the IPVS backend's masquerade rules.
	IPTables IPTablesConfig
	// IPVS holds settings used only by the IPVS backend.
	IPVS IPVSConfig
	// Conntrack sizes the connection-tracking table and sets its timeouts,
	// as kube-proxy's conntrack section does.
	Conntrack ConntrackConfig
	// Hooks holds settings shared by all hook plugins.
	Hooks HooksConfig
	// Plugins are the hook plugins, in the order they run, as hooks.Check
	// passed them: a zero value takes the hooks' default. Nil when unset.
	Plugins []hooks.Config

	// Warnings name the fields of a KubeProxyConfiguration file that Weir
	// read but ignores, each with the reason, for the caller to log.
	Warnings []string
	// Ineffective names the settings given explicitly that have no effect
	// with the defaults of the mode, each "key: why", for the caller to log.
	Ineffective []string
	// pluginEntries holds the plugins list as written, until decodePlugins
	// validates it into Plugins.
	pluginEntries []map[string]any
}

// HooksConfig holds settings shared by all hook plugins.
type HooksConfig struct {
	// CacheDir keeps compiled plugins between restarts.
	CacheDir string
}

// SourceConfig says where Weir reads Kubernetes objects from.
type SourceConfig struct {
	// Kind is "files" (a folder of manifests) or "kubernetes" (an API server).
	Kind string
	// Path is the folder of manifests read by the files source.
	Path string
	// Kubeconfig is the kubeconfig file used by the kubernetes source; empty
	// means the in-cluster service account.
	Kubeconfig string
}

// NodePortAddresses selects which of the node's addresses accept NodePort traffic.
//
// The zero value (Primary false, CIDRs nil) means every local address, the
// keyword all.
type NodePortAddresses struct {
	// Primary restricts NodePorts to the node's primary IPs, as listed in
	// its Node object.
	Primary bool
	// CIDRs restricts NodePorts to the local addresses inside these ranges.
	CIDRs []netip.Prefix
}

// String returns the value as nodePortAddresses takes it: "primary", "all"
// or comma-separated CIDRs.
func (a NodePortAddresses) String() string {
	switch {
	case a.Primary:
		return nodePortsPrimary
	case len(a.CIDRs) == 0:
		return nodePortsAll
	}
	return strings.Join(prefixStrings(a.CIDRs), ",")
}

// PortRange is an inclusive range of ports.
type PortRange struct {
	First, Last uint16
}

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port uint16) bool { return port >= r.First && port <= r.Last }

// String formats the range as the API server's flag does: "30000-32767".
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// LogConfig configures the process log.
type LogConfig struct {
	// Format is "text" or "json".
	Format string
	// Level is "debug", "info", "warn" or "error".
	Level string
}

// LocalDetectorConfig says how traffic from this cluster's pods is told apart.
type LocalDetectorConfig struct {
	// Mode is one of backends.LocalDetectors.
	Mode backends.LocalDetector
	// InterfaceNamePrefix is the pod interface prefix for InterfaceNamePrefix mode.
	InterfaceNamePrefix string
}

// NFTablesConfig holds settings used only by the nftables backend.
type NFTablesConfig struct {
	// Table is the name of the nftables table Weir creates and owns.
	Table string
	// CommentBuckets gives the endpoints maps' buckets the comment naming
	// their service port, as every other element of the port has.
	CommentBuckets bool
}

// IPTablesConfig holds settings of the iptables backend.
type IPTablesConfig struct {
	// Backend picks the iptables flavour: "auto" (the one the host already
	// uses, like kube-proxy), "nft" or "legacy". Mode ipvs writes its
	// masquerade rules with this flavour too.
	Backend string
}

// IPVSSchedulers are the IPVS schedulers ipvs.scheduler accepts, by their
// kernel names. It is a copy of backends/ipvs.Schedulers, kept here so that
// configuration does not pull in the backend's netlink dependencies; a
// test in cmd/weir keeps the two equal.
var IPVSSchedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"}

// ConntrackConfig holds kube-proxy's conntrack settings; a zero value
// leaves its kernel parameter alone.
type ConntrackConfig struct {
	// MaxPerCore times the number of CPUs, but at least Min, is the
	// nf_conntrack_max Weir sets; MaxPerCore 0 leaves it alone.
	MaxPerCore, Min int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set
	// nf_conntrack_tcp_timeout_established and _close_wait.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1; in mode iptables
	// it also keeps packets conntrack calls invalid (they are dropped
	// otherwise, as kube-proxy does).
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout and
	// _udp_timeout_stream.
	UDPTimeout, UDPStreamTimeout time.Duration
}

// IPVSConfig holds settings used only by the IPVS backend, named after
// kube-proxy's ipvs section where one exists.
type IPVSConfig struct {
	// Scheduler balances the services whose plan (after the hook plugins)
	// names no scheduler, or one IPVS does not know; one of IPVSSchedulers.
	Scheduler string
	// StrictARP stops the node answering ARP for the service addresses on
	// Interface (net.ipv4.conf.all.arp_ignore=1 and arp_announce=2, like
	// kube-proxy's strictARP), as MetalLB and kube-vip need.
	StrictARP bool
	// GracePeriod bounds how long a removed endpoint's real server stays,
	// at weight 0, while it still has connections.
	GracePeriod time.Duration
	// Interface is the dummy interface that holds every service address.
	Interface string
}

// Default returns the configuration Weir uses when nothing is set.
//
// Its NodePortAddresses and LocalhostNodePorts are those of mode nftables;
// Load gives a configuration that sets another mode that mode's defaults.
//
// NodeName defaults to the host name in lower case, like kube-proxy's
// --hostname-override; it is empty if the host name cannot be read, which
// Load then reports as an error.
func Default() *Config {
	c := &Config{
		Mode:               "nftables",
		NodeName:           defaultNodeName(),
		Source:             SourceConfig{Kind: "files", Path: "/etc/weir/manifests"},
		SyncPeriod:         30 * time.Second,
		MinSyncPeriod:      time.Second,
		MetricsBindAddress: "127.0.0.1:10249",
		HealthzBindAddress: "0.0.0.0:10256",
		Log:                LogConfig{Format: "text", Level: "info"},
		NFTables:           NFTablesConfig{Table: "weir", CommentBuckets: true},
		IPTables:           IPTablesConfig{Backend: "auto"},
		IPVS:               IPVSConfig{Scheduler: "rr", GracePeriod: 15 * time.Minute, Interface: "weir-ipvs0"},
		Hooks:              HooksConfig{CacheDir: "/var/lib/weir/cache"},
		LocalDetector:      LocalDetectorConfig{Mode: backends.DetectClusterCIDR},
		NodePortRange:      PortRange{First: 30000, Last: 32767},
		Conntrack: ConntrackConfig{MaxPerCore: 32768, Min: 131072,
			TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
	}
	defaultNodePortAddresses(c)
	defaultLocalhostNodePorts(c)
	return c
}

func defaultNodeName() string {
	name, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(name))
}

// Load reads and validates the configuration.
//
// fs must already be parsed and should carry the flags from RegisterFlags; it
// may be nil. environ is a list of KEY=value strings like os.Environ(); only
// the WEIR_* entries are read. The YAML file is read only when --config or
// WEIR_CONFIG names one.
func Load(fs *pflag.FlagSet, environ []string) (*Config, error) {
	l := newLoader()
	if err := l.loadDefaults(); err != nil {
		return nil, err
	}
	if path := configPath(fs, environ); path != "" {
		if err := l.loadFile(path); err != nil {
			return nil, err
		}
	}
	if err := l.loadEnv(environ); err != nil {
		return nil, err
	}
	if err := l.loadFlags(fs); err != nil {
		return nil, err
	}
	c := l.decode()
	if len(l.errs) > 0 {
		return nil, joinErrors(l.errs)
	}
	return c, nil
}

// configPath returns the YAML file named by --config, else by WEIR_CONFIG.
func configPath(fs *pflag.FlagSet, environ []string) string {
	if fs != nil {
		if f := fs.Lookup(configFlag); f != nil && f.Changed {
			return f.Value.String()
		}
	}
	path := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, configEnv+"="); ok {
			path = v // the last one wins, as with the other variables
		}
	}
	return path
}

func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}
