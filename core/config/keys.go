package config

import (
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
)

// field is one configuration key. The fields table below is the single list
// of known keys: the YAML schema, the environment names and the flags are all
// derived from it.
type field struct {
	key   string                  // koanf key as written in YAML, nested with "."
	flag  string                  // flag name without "--"; "" when there is none
	typ   string                  // value type shown by --help
	env   bool                    // whether WEIR_<KEY> sets it
	usage string                  // one line for --help
	get   func(*Config) any       // the raw form of c's value, for the defaults layer
	set   func(*Config, any) *bad // decodes and validates a raw value into c
	// byMode, when set, makes the key's default depend on the mode: the
	// defaults layer leaves the key out, and when no layer sets it (or a
	// list key is set to an empty list) decode calls byMode once the mode
	// is known.
	byMode func(*Config)
}

const (
	envPrefix  = "WEIR_"
	configFlag = "config"
	configEnv  = "WEIR_CONFIG"
)

var fields = []field{
	{key: "mode", flag: "mode", typ: "string", env: true,
		usage: "kernel backend: nftables, iptables or ipvs",
		get:   func(c *Config) any { return c.Mode },
		set:   enumKey(func(c *Config) *string { return &c.Mode }, "nftables", "iptables", "ipvs")},
	{key: "nodeName", flag: "node-name", typ: "string", env: true,
		usage: "name of this node's Node object; defaults to the host name in lower case",
		get:   func(c *Config) any { return c.NodeName },
		set:   setNodeName},
	{key: "source.kind", flag: "source-kind", typ: "string", env: true,
		usage: "where objects come from: files or kubernetes",
		get:   func(c *Config) any { return c.Source.Kind },
		set:   enumKey(func(c *Config) *string { return &c.Source.Kind }, "files", "kubernetes")},
	{key: "source.path", flag: "source-path", typ: "path", env: true,
		usage: "folder of Kubernetes manifests read by the files source",
		get:   func(c *Config) any { return c.Source.Path },
		set:   stringKey(func(c *Config) *string { return &c.Source.Path }, allowedPath, nonEmpty)},
	{key: "source.kubeconfig", flag: "kubeconfig", typ: "path", env: true,
		usage: "kubeconfig file for the kubernetes source; empty means in-cluster",
		get:   func(c *Config) any { return c.Source.Kubeconfig },
		set:   stringKey(func(c *Config) *string { return &c.Source.Kubeconfig }, allowedKubeconfig, anyString)},
	{key: "clusterCIDRs", flag: "cluster-cidrs", typ: "cidrs", env: true,
		usage: "comma-separated pod CIDRs; traffic from outside them to a cluster IP is masqueraded",
		get:   func(c *Config) any { return prefixStrings(c.ClusterCIDRs) },
		set:   cidrsKey(func(c *Config) *[]netip.Prefix { return &c.ClusterCIDRs })},
	{key: "serviceCIDRs", flag: "service-cidrs", typ: "cidrs", env: true,
		usage: "comma-separated ranges cluster IPs come from, besides those of ServiceCIDR objects; nftables mode drops traffic to unallocated addresses in them",
		get:   func(c *Config) any { return prefixStrings(c.ServiceCIDRs) },
		set:   cidrsKey(func(c *Config) *[]netip.Prefix { return &c.ServiceCIDRs })},
	{key: "localDetector.mode", flag: "local-detector", typ: "string", env: true,
		usage: "how traffic from this cluster's pods is told apart: " + orList(backends.LocalDetectors),
		get:   func(c *Config) any { return string(c.LocalDetector.Mode) },
		set:   enumKey(func(c *Config) *backends.LocalDetector { return &c.LocalDetector.Mode }, backends.LocalDetectors...)},
	{key: "localDetector.interfaceNamePrefix", flag: "pod-interface-name-prefix", typ: "string", env: true,
		usage: "with localDetector.mode InterfaceNamePrefix: the prefix of pod interfaces, such as veth",
		get:   func(c *Config) any { return c.LocalDetector.InterfaceNamePrefix },
		set:   stringKey(func(c *Config) *string { return &c.LocalDetector.InterfaceNamePrefix }, allowedIfPrefix, isIfPrefix)},
	{key: "masqueradeAll", flag: "masquerade-all", typ: "bool", env: true,
		usage: "masquerade all traffic sent to service IPs",
		get:   func(c *Config) any { return c.MasqueradeAll },
		set:   boolKey(func(c *Config) *bool { return &c.MasqueradeAll })},
	{key: "localhostNodePorts", flag: "localhost-node-ports", typ: "bool", env: true,
		usage:  "with nodePortAddresses all, also accept NodePort connections to 127.0.0.1 (sets net.ipv4.conf.all.route_localnet=1); default true in modes iptables and ipvs (which ignores it), false in mode nftables",
		get:    func(c *Config) any { return c.LocalhostNodePorts },
		set:    boolKey(func(c *Config) *bool { return &c.LocalhostNodePorts }),
		byMode: defaultLocalhostNodePorts},
	{key: "nodePortAddresses", flag: "node-port-addresses", typ: "cidrs", env: true,
		usage:  "the node addresses that accept NodePorts: primary, all, or comma-separated CIDRs; default primary in mode nftables, all in modes iptables and ipvs",
		get:    getNodePortAddresses,
		set:    setNodePortAddresses,
		byMode: defaultNodePortAddresses},
	{key: "nodePortRange", flag: "node-port-range", typ: "range", env: true,
		usage: "the API server's service-node-port-range: node ports outside it are skipped with a warning",
		get:   func(c *Config) any { return c.NodePortRange.String() },
		set:   setPortRange},
	{key: "takeover", flag: "takeover", typ: "bool", env: true,
		usage: "after the first commit, remove what kube-proxy left on the node in every mode (its nftables tables, iptables chains, IPVS virtual servers, kube-ipvs0 and ipsets)",
		get:   func(c *Config) any { return c.Takeover },
		set:   boolKey(func(c *Config) *bool { return &c.Takeover })},
	{key: "syncPeriod", flag: "sync-period", typ: "duration", env: true,
		usage: "longest time between two full syncs of kernel state",
		get:   func(c *Config) any { return c.SyncPeriod.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.SyncPeriod }, true)},
	{key: "minSyncPeriod", flag: "min-sync-period", typ: "duration", env: true,
		usage: "shortest time between two syncs, however fast changes arrive",
		get:   func(c *Config) any { return c.MinSyncPeriod.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.MinSyncPeriod }, false)},
	{key: "metricsBindAddress", flag: "metrics-bind-address", typ: "ip:port", env: true,
		usage: "IP:port of the /metrics and /proxyMode server; empty disables it",
		get:   func(c *Config) any { return c.MetricsBindAddress },
		set:   stringKey(func(c *Config) *string { return &c.MetricsBindAddress }, allowedBindAddress, isBindAddress)},
	{key: "healthzBindAddress", flag: "healthz-bind-address", typ: "ip:port", env: true,
		usage: "IP:port of the /healthz and /livez server; empty disables it",
		get:   func(c *Config) any { return c.HealthzBindAddress },
		set:   stringKey(func(c *Config) *string { return &c.HealthzBindAddress }, allowedBindAddress, isBindAddress)},
	{key: "enableProfiling", flag: "profiling", typ: "bool", env: true,
		usage: "serve Go's CPU, heap and goroutine profiles under /debug/pprof/ on the metrics server",
		get:   func(c *Config) any { return c.EnableProfiling },
		set:   boolKey(func(c *Config) *bool { return &c.EnableProfiling })},
	{key: "log.format", flag: "log-format", typ: "string", env: true,
		usage: "log format: text or json",
		get:   func(c *Config) any { return c.Log.Format },
		set:   enumKey(func(c *Config) *string { return &c.Log.Format }, "text", "json")},
	{key: "log.level", flag: "log-level", typ: "string", env: true,
		usage: "lowest log level written: debug, info, warn or error",
		get:   func(c *Config) any { return c.Log.Level },
		set:   enumKey(func(c *Config) *string { return &c.Log.Level }, "debug", "info", "warn", "error")},
	{key: "nftables.table", flag: "nftables-table", typ: "string", env: true,
		usage: "name of the nftables table Weir owns",
		get:   func(c *Config) any { return c.NFTables.Table },
		set:   stringKey(func(c *Config) *string { return &c.NFTables.Table }, allowedTable, isTableName)},
	{key: "nftables.commentBuckets", flag: "nftables-comment-buckets", typ: "bool", env: true,
		usage: "give the endpoint buckets the comment naming their service port, as its chains and other elements have (false: a full sync about 8% faster)",
		get:   func(c *Config) any { return c.NFTables.CommentBuckets },
		set:   boolKey(func(c *Config) *bool { return &c.NFTables.CommentBuckets })},
	{key: "iptables.backend", flag: "iptables-backend", typ: "string", env: true,
		usage: "iptables flavour of mode iptables and of mode ipvs's masquerade rules: auto (the one the host uses), nft or legacy",
		get:   func(c *Config) any { return c.IPTables.Backend },
		set:   enumKey(func(c *Config) *string { return &c.IPTables.Backend }, "auto", "nft", "legacy")},
	{key: "conntrack.maxPerCore", flag: "conntrack-max-per-core", typ: "int", env: true,
		usage: "connections tracked per CPU: nf_conntrack_max is this times the CPUs, at least conntrack.min; 0 leaves it alone",
		get:   func(c *Config) any { return c.Conntrack.MaxPerCore },
		set:   intKey(func(c *Config) *int { return &c.Conntrack.MaxPerCore })},
	{key: "conntrack.min", flag: "conntrack-min", typ: "int", env: true,
		usage: "the smallest nf_conntrack_max conntrack.maxPerCore may set",
		get:   func(c *Config) any { return c.Conntrack.Min },
		set:   intKey(func(c *Config) *int { return &c.Conntrack.Min })},
	{key: "conntrack.tcpEstablishedTimeout", flag: "conntrack-tcp-timeout-established", typ: "duration", env: true,
		usage: "nf_conntrack_tcp_timeout_established; 0 leaves it alone",
		get:   func(c *Config) any { return c.Conntrack.TCPEstablishedTimeout.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.Conntrack.TCPEstablishedTimeout }, false)},
	{key: "conntrack.tcpCloseWaitTimeout", flag: "conntrack-tcp-timeout-close-wait", typ: "duration", env: true,
		usage: "nf_conntrack_tcp_timeout_close_wait; 0 leaves it alone",
		get:   func(c *Config) any { return c.Conntrack.TCPCloseWaitTimeout.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.Conntrack.TCPCloseWaitTimeout }, false)},
	{key: "conntrack.tcpBeLiberal", flag: "conntrack-tcp-be-liberal", typ: "bool", env: true,
		usage: "set nf_conntrack_tcp_be_liberal, and in mode iptables keep packets conntrack calls invalid",
		get:   func(c *Config) any { return c.Conntrack.TCPBeLiberal },
		set:   boolKey(func(c *Config) *bool { return &c.Conntrack.TCPBeLiberal })},
	{key: "conntrack.udpTimeout", flag: "conntrack-udp-timeout", typ: "duration", env: true,
		usage: "nf_conntrack_udp_timeout; 0 leaves it alone",
		get:   func(c *Config) any { return c.Conntrack.UDPTimeout.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.Conntrack.UDPTimeout }, false)},
	{key: "conntrack.udpStreamTimeout", flag: "conntrack-udp-timeout-stream", typ: "duration", env: true,
		usage: "nf_conntrack_udp_timeout_stream; 0 leaves it alone",
		get:   func(c *Config) any { return c.Conntrack.UDPStreamTimeout.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.Conntrack.UDPStreamTimeout }, false)},
	{key: "ipvs.scheduler", flag: "ipvs-scheduler", typ: "string", env: true,
		usage: "in mode ipvs, the scheduler of services whose plan names none: " + strings.Join(IPVSSchedulers, ", "),
		get:   func(c *Config) any { return c.IPVS.Scheduler },
		set:   enumKey(func(c *Config) *string { return &c.IPVS.Scheduler }, IPVSSchedulers...)},
	{key: "ipvs.strictARP", flag: "ipvs-strict-arp", typ: "bool", env: true,
		usage: "in mode ipvs, do not answer ARP for the service addresses (net.ipv4.conf.all.arp_ignore=1, arp_announce=2), as MetalLB needs",
		get:   func(c *Config) any { return c.IPVS.StrictARP },
		set:   boolKey(func(c *Config) *bool { return &c.IPVS.StrictARP })},
	{key: "ipvs.gracePeriod", flag: "ipvs-grace-period", typ: "duration", env: true,
		usage: "in mode ipvs, longest time a removed TCP endpoint keeps its established connections",
		get:   func(c *Config) any { return c.IPVS.GracePeriod.String() },
		set:   durationKey(func(c *Config) *time.Duration { return &c.IPVS.GracePeriod }, true)},
	{key: "ipvs.interface", flag: "ipvs-interface", typ: "string", env: true,
		usage: "in mode ipvs, the dummy interface Weir creates to hold the service addresses",
		get:   func(c *Config) any { return c.IPVS.Interface },
		set:   stringKey(func(c *Config) *string { return &c.IPVS.Interface }, allowedIfName, isIfName)},
	{key: "hooks.cacheDir", flag: "hooks-cache-dir", typ: "path", env: true,
		usage: "folder that keeps compiled hook plugins between restarts",
		get:   func(c *Config) any { return c.Hooks.CacheDir },
		set:   stringKey(func(c *Config) *string { return &c.Hooks.CacheDir }, allowedPath, nonEmpty)},
	{key: "plugins",
		get: getPlugins,
		set: setPlugins},
}

// Lookup tables derived from fields.
var (
	byKey    = map[string]*field{}
	byEnv    = map[string]*field{}
	byFlag   = map[string]*field{}
	sections = map[string][]string{} // section ("" for the top level) → its child names, in table order
)

func init() {
	for i := range fields {
		f := &fields[i]
		byKey[f.key] = f
		if f.env {
			byEnv[envName(f.key)] = f
		}
		if f.flag != "" {
			byFlag[f.flag] = f
		}
		addToSections(f.key)
	}
}

// addToSections records key and every section above it.
func addToSections(key string) {
	parent := ""
	for _, part := range strings.Split(key, ".") {
		if !slices.Contains(sections[parent], part) {
			sections[parent] = append(sections[parent], part)
		}
		parent = joinKey(parent, part)
	}
}

func joinKey(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// envName derives the environment variable of a key: "WEIR_" followed by the
// key in upper snake case, where a new word starts at each upper-case letter
// that follows a lower-case letter or digit, and at each ".".
// For example "clusterCIDRs" becomes WEIR_CLUSTER_CIDRS and "source.kind"
// becomes WEIR_SOURCE_KIND.
func envName(key string) string {
	var b strings.Builder
	b.WriteString(envPrefix)
	prev := rune(0)
	for _, r := range key {
		switch {
		case r == '.':
			b.WriteByte('_')
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			b.WriteByte('_')
			b.WriteRune(r)
		default:
			b.WriteRune(unicode.ToUpper(r))
		}
		prev = r
	}
	return b.String()
}

// RegisterFlags adds Weir's configuration flags, and --config, to fs.
//
// The flags keep their values as text; Load validates them, so a bad flag
// value gives the same *Error as a bad value anywhere else. List flags may be
// repeated or comma-separated.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String(configFlag, "", "YAML configuration file (env "+configEnv+")")
	def := Default()
	for i := range fields {
		f := &fields[i]
		if f.flag == "" {
			continue
		}
		v := &rawValue{typ: f.typ, list: f.typ == "cidrs"}
		if f.byMode == nil {
			v.text = show(f.get(def)) // a default that depends on the mode is in the usage
		}
		usage := f.usage + " (env " + envName(f.key) + ")"
		fs.VarPF(v, f.flag, "", usage)
	}
}

// rawValue is a pflag.Value that keeps the text as given; Load decodes it.
type rawValue struct {
	text string
	typ  string
	list bool // repeated use appends, comma-separated
	set  bool
}

func (v *rawValue) String() string { return v.text }

func (v *rawValue) Type() string { return v.typ }

// IsBoolFlag lets "--masquerade-all" stand for "--masquerade-all=true".
func (v *rawValue) IsBoolFlag() bool { return v.typ == "bool" }

func (v *rawValue) Set(s string) error {
	if v.list && v.set {
		v.text += "," + s
	} else {
		v.text = s
	}
	v.set = true
	return nil
}
