package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
)

// input is one way of configuring Weir: a YAML file (passed with --config
// when non-empty), an environment and command-line arguments.
type input struct {
	yaml string
	env  []string
	args []string
}

func load(t *testing.T, in input) (*Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("weir", pflag.ContinueOnError)
	RegisterFlags(fs)
	args := in.args
	if in.yaml != "" {
		args = append([]string{"--config", writeFile(t, in.yaml)}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return Load(fs, in.env)
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func prefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestDefault(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Mode:               "nftables",
		NodeName:           strings.ToLower(host),
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
		LocalhostNodePorts: false,
		NodePortAddresses:  NodePortAddresses{Primary: true},
		NodePortRange:      PortRange{First: 30000, Last: 32767},
		Conntrack: ConntrackConfig{MaxPerCore: 32768, Min: 131072,
			TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
	}
	if got := Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("Default() = %+v, want %+v", got, want)
	}
	got, err := load(t, input{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load with nothing set = %+v, want %+v", got, want)
	}
	got, err = Load(nil, nil)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Load(nil, nil) = %+v, %v; want %+v", got, err, want)
	}
}

// setMode sets c's mode and the defaults that follow it, as Load does for
// a mode some layer sets.
func setMode(c *Config, mode string) {
	c.Mode = mode
	defaultNodePortAddresses(c)
	defaultLocalhostNodePorts(c)
}

func TestNames(t *testing.T) {
	tests := []struct{ key, env, flag string }{
		{"mode", "WEIR_MODE", "mode"},
		{"nodeName", "WEIR_NODE_NAME", "node-name"},
		{"source.kind", "WEIR_SOURCE_KIND", "source-kind"},
		{"source.path", "WEIR_SOURCE_PATH", "source-path"},
		{"source.kubeconfig", "WEIR_SOURCE_KUBECONFIG", "kubeconfig"},
		{"clusterCIDRs", "WEIR_CLUSTER_CIDRS", "cluster-cidrs"},
		{"serviceCIDRs", "WEIR_SERVICE_CIDRS", "service-cidrs"},
		{"localDetector.mode", "WEIR_LOCAL_DETECTOR_MODE", "local-detector"},
		{"localDetector.interfaceNamePrefix", "WEIR_LOCAL_DETECTOR_INTERFACE_NAME_PREFIX", "pod-interface-name-prefix"},
		{"masqueradeAll", "WEIR_MASQUERADE_ALL", "masquerade-all"},
		{"localhostNodePorts", "WEIR_LOCALHOST_NODE_PORTS", "localhost-node-ports"},
		{"takeover", "WEIR_TAKEOVER", "takeover"},
		{"nodePortAddresses", "WEIR_NODE_PORT_ADDRESSES", "node-port-addresses"},
		{"nodePortRange", "WEIR_NODE_PORT_RANGE", "node-port-range"},
		{"syncPeriod", "WEIR_SYNC_PERIOD", "sync-period"},
		{"minSyncPeriod", "WEIR_MIN_SYNC_PERIOD", "min-sync-period"},
		{"metricsBindAddress", "WEIR_METRICS_BIND_ADDRESS", "metrics-bind-address"},
		{"healthzBindAddress", "WEIR_HEALTHZ_BIND_ADDRESS", "healthz-bind-address"},
		{"enableProfiling", "WEIR_ENABLE_PROFILING", "profiling"},
		{"log.format", "WEIR_LOG_FORMAT", "log-format"},
		{"log.level", "WEIR_LOG_LEVEL", "log-level"},
		{"nftables.table", "WEIR_NFTABLES_TABLE", "nftables-table"},
		{"nftables.commentBuckets", "WEIR_NFTABLES_COMMENT_BUCKETS", "nftables-comment-buckets"},
		{"iptables.backend", "WEIR_IPTABLES_BACKEND", "iptables-backend"},
		{"conntrack.maxPerCore", "WEIR_CONNTRACK_MAX_PER_CORE", "conntrack-max-per-core"},
		{"conntrack.min", "WEIR_CONNTRACK_MIN", "conntrack-min"},
		{"conntrack.tcpEstablishedTimeout", "WEIR_CONNTRACK_TCP_ESTABLISHED_TIMEOUT", "conntrack-tcp-timeout-established"},
		{"conntrack.tcpCloseWaitTimeout", "WEIR_CONNTRACK_TCP_CLOSE_WAIT_TIMEOUT", "conntrack-tcp-timeout-close-wait"},
		{"conntrack.tcpBeLiberal", "WEIR_CONNTRACK_TCP_BE_LIBERAL", "conntrack-tcp-be-liberal"},
		{"conntrack.udpTimeout", "WEIR_CONNTRACK_UDP_TIMEOUT", "conntrack-udp-timeout"},
		{"conntrack.udpStreamTimeout", "WEIR_CONNTRACK_UDP_STREAM_TIMEOUT", "conntrack-udp-timeout-stream"},
		{"ipvs.scheduler", "WEIR_IPVS_SCHEDULER", "ipvs-scheduler"},
		{"ipvs.strictARP", "WEIR_IPVS_STRICT_ARP", "ipvs-strict-arp"},
		{"ipvs.gracePeriod", "WEIR_IPVS_GRACE_PERIOD", "ipvs-grace-period"},
		{"ipvs.interface", "WEIR_IPVS_INTERFACE", "ipvs-interface"},
		{"hooks.cacheDir", "WEIR_HOOKS_CACHE_DIR", "hooks-cache-dir"},
		{"plugins", "", ""},
	}
	if len(tests) != len(fields) {
		t.Fatalf("%d keys tested, %d known", len(tests), len(fields))
	}
	fs := pflag.NewFlagSet("weir", pflag.ContinueOnError)
	RegisterFlags(fs)
	for _, tc := range tests {
		f := byKey[tc.key]
		if f == nil {
			t.Errorf("key %s unknown", tc.key)
			continue
		}
		if env := byEnv[tc.env]; tc.env != "" && env != f {
			t.Errorf("%s: no key for %s", tc.key, tc.env)
		}
		if !f.env && tc.env != "" || f.env && tc.env == "" {
			t.Errorf("%s: env = %v, want %q", tc.key, f.env, tc.env)
		}
		if f.flag != tc.flag || (tc.flag != "" && fs.Lookup(tc.flag) == nil) {
			t.Errorf("%s: flag = %q (registered: %v), want %q", tc.key, f.flag, fs.Lookup(tc.flag) != nil, tc.flag)
		}
	}
	if fs.Lookup("config") == nil {
		t.Error("no --config flag")
	}
}

func TestPrecedence(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		name string
		in   input
		want func(c *Config)
	}{
		{"file overrides default",
			input{yaml: "mode: iptables\n"},
			func(c *Config) { setMode(c, "iptables") }},
		{"environment overrides file",
			input{yaml: "mode: iptables\nsyncPeriod: 10s\n", env: []string{"WEIR_MODE=ipvs"}},
			func(c *Config) { setMode(c, "ipvs"); c.SyncPeriod = 10 * time.Second }},
		{"flag overrides environment",
			input{yaml: "mode: iptables\n", env: []string{"WEIR_MODE=ipvs"}, args: []string{"--mode=nftables"}},
			func(c *Config) { setMode(c, "nftables") }},
		{"flag overrides file",
			input{yaml: "log: {level: warn}\n", args: []string{"--log-level", "debug"}},
			func(c *Config) { c.Log.Level = "debug" }},
		{"unset flag does not override environment",
			input{env: []string{"WEIR_MODE=ipvs"}, args: []string{"--sync-period=10s"}},
			func(c *Config) { setMode(c, "ipvs"); c.SyncPeriod = 10 * time.Second }},
		{"unset flag does not override file",
			input{yaml: "mode: ipvs\nmasqueradeAll: true\n"},
			func(c *Config) { setMode(c, "ipvs"); c.MasqueradeAll = true }},
		{"nested keys merge across layers",
			input{yaml: "source:\n  kind: kubernetes\n", env: []string{"WEIR_SOURCE_PATH=/srv/m"}, args: []string{"--kubeconfig=/k"}},
			func(c *Config) { c.Source = SourceConfig{Kind: "kubernetes", Path: "/srv/m", Kubeconfig: "/k"} }},
		{"last duplicate variable wins",
			input{env: []string{"WEIR_MODE=iptables", "WEIR_MODE=ipvs"}},
			func(c *Config) { setMode(c, "ipvs") }},
		{"environment can empty a file's list",
			input{yaml: "clusterCIDRs: [10.0.0.0/8]\n", env: []string{"WEIR_CLUSTER_CIDRS="}},
			func(c *Config) {}},
		{"--config wins over WEIR_CONFIG",
			input{yaml: "mode: ipvs\n", env: []string{"WEIR_CONFIG=" + missing}},
			func(c *Config) { setMode(c, "ipvs") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := load(t, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			tc.want(want)
			got.pluginEntries = nil // compared as Plugins in plugins_test.go
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	path := writeFile(t, "mode: ipvs\n")
	got, err := Load(nil, []string{"WEIR_CONFIG=" + path})
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != "ipvs" {
		t.Errorf("Mode = %q, want ipvs from the file named by WEIR_CONFIG", got.Mode)
	}
}

func TestValues(t *testing.T) {
	tests := []struct {
		name string
		in   input
		want func(c *Config)
	}{
		{"sub-second durations",
			input{env: []string{"WEIR_MIN_SYNC_PERIOD=500ms"}, args: []string{"--sync-period=1m30s"}},
			func(c *Config) { c.MinSyncPeriod = 500 * time.Millisecond; c.SyncPeriod = 90 * time.Second }},
		{"zero minSyncPeriod",
			input{yaml: "minSyncPeriod: 0\nsyncPeriod: 2m\n"},
			func(c *Config) { c.MinSyncPeriod = 0; c.SyncPeriod = 2 * time.Minute }},
		{"minSyncPeriod equal to syncPeriod",
			input{args: []string{"--min-sync-period=5s", "--sync-period=5s"}},
			func(c *Config) { c.MinSyncPeriod = 5 * time.Second; c.SyncPeriod = 5 * time.Second }},
		{"list from environment",
			input{env: []string{"WEIR_CLUSTER_CIDRS=10.0.0.0/8,fd00::/48"}},
			func(c *Config) { c.ClusterCIDRs = prefixes(t, "10.0.0.0/8", "fd00::/48") }},
		{"list from environment with spaces",
			input{env: []string{"WEIR_CLUSTER_CIDRS= 10.0.0.0/8 , fd00::/48,"}},
			func(c *Config) { c.ClusterCIDRs = prefixes(t, "10.0.0.0/8", "fd00::/48") }},
		{"list from YAML",
			input{yaml: "clusterCIDRs:\n  - 10.0.0.0/8\n  - fd00::/48\n"},
			func(c *Config) { c.ClusterCIDRs = prefixes(t, "10.0.0.0/8", "fd00::/48") }},
		{"list from repeated flag",
			input{args: []string{"--cluster-cidrs=10.0.0.0/8", "--cluster-cidrs=fd00::/48"}},
			func(c *Config) { c.ClusterCIDRs = prefixes(t, "10.0.0.0/8", "fd00::/48") }},
		{"host bits cleared",
			input{args: []string{"--cluster-cidrs=10.1.2.3/8"}},
			func(c *Config) { c.ClusterCIDRs = prefixes(t, "10.0.0.0/8") }},
		{"nodePortAddresses primary in YAML",
			input{yaml: "nodePortAddresses: [primary]\n"},
			func(c *Config) { c.NodePortAddresses.Primary = true }},
		{"nodePortAddresses primary from environment",
			input{env: []string{"WEIR_NODE_PORT_ADDRESSES=primary"}},
			func(c *Config) { c.NodePortAddresses.Primary = true }},
		{"nodePortRange from flag",
			input{args: []string{"--node-port-range=20000-22767"}},
			func(c *Config) { c.NodePortRange = PortRange{First: 20000, Last: 22767} }},
		{"nodePortRange of one port in YAML",
			input{yaml: "nodePortRange: 30080-30080\n"},
			func(c *Config) { c.NodePortRange = PortRange{First: 30080, Last: 30080} }},
		{"nodePortAddresses CIDRs from flag",
			input{args: []string{"--node-port-addresses=192.168.0.0/16,fd00::/64"}},
			func(c *Config) {
				c.NodePortAddresses = NodePortAddresses{CIDRs: prefixes(t, "192.168.0.0/16", "fd00::/64")}
			}},
		{"bare bool flag",
			input{args: []string{"--masquerade-all"}},
			func(c *Config) { c.MasqueradeAll = true }},
		{"bool from environment",
			input{yaml: "masqueradeAll: true\n", env: []string{"WEIR_MASQUERADE_ALL=false"}},
			func(c *Config) {}},
		{"node name lower-cased",
			input{env: []string{"WEIR_NODE_NAME=Node-A.Example.COM"}},
			func(c *Config) { c.NodeName = "node-a.example.com" }},
		{"bind addresses",
			input{args: []string{"--metrics-bind-address=[::1]:9000", "--healthz-bind-address=:10256"}},
			func(c *Config) { c.MetricsBindAddress = "[::1]:9000"; c.HealthzBindAddress = ":10256" }},
		{"empty bind addresses disable the servers",
			input{yaml: "metricsBindAddress: \"\"\n", env: []string{"WEIR_HEALTHZ_BIND_ADDRESS="}},
			func(c *Config) { c.MetricsBindAddress = ""; c.HealthzBindAddress = "" }},
		{"log and nftables",
			input{yaml: "log:\n  format: json\n  level: error\nnftables:\n  table: kube-proxy_2\n"},
			func(c *Config) { c.Log = LogConfig{"json", "error"}; c.NFTables.Table = "kube-proxy_2" }},
		{"ipvs from YAML",
			input{yaml: "mode: ipvs\nipvs:\n  scheduler: mh\n  strictARP: true\n  gracePeriod: 90s\n  interface: kube-ipvs0\n"},
			func(c *Config) {
				setMode(c, "ipvs")
				c.IPVS = IPVSConfig{Scheduler: "mh", StrictARP: true, GracePeriod: 90 * time.Second, Interface: "kube-ipvs0"}
			}},
		{"ipvs from environment and flags",
			input{env: []string{"WEIR_IPVS_SCHEDULER=wlc", "WEIR_IPVS_GRACE_PERIOD=1h"}, args: []string{"--ipvs-strict-arp", "--ipvs-interface=ipvs0", "--iptables-backend=legacy"}},
			func(c *Config) {
				c.IPVS = IPVSConfig{Scheduler: "wlc", StrictARP: true, GracePeriod: time.Hour, Interface: "ipvs0"}
				c.IPTables.Backend = "legacy"
			}},
		{"ipvs scheduler: environment over file",
			input{yaml: "ipvs: {scheduler: sed}\n", env: []string{"WEIR_IPVS_SCHEDULER=nq"}},
			func(c *Config) { c.IPVS.Scheduler = "nq" }},
		{"hooks cache folder",
			input{args: []string{"--hooks-cache-dir=/tmp/weir-cache"}},
			func(c *Config) { c.Hooks.CacheDir = "/tmp/weir-cache" }},
		{"null YAML values are absent",
			input{yaml: "syncPeriod:\nsource:\nplugins:\n"},
			func(c *Config) {}},
		{"empty YAML file",
			input{yaml: "# nothing\n"},
			func(c *Config) {}},
		{"other variables ignored",
			input{env: []string{"PATH=/bin", "weir_mode=bogus", "WEIRD=1", "NOEQUALS"}},
			func(c *Config) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := load(t, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			tc.want(want)
			got.pluginEntries = nil // compared as Plugins in plugins_test.go
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestIPVSSchedulers(t *testing.T) {
	for _, name := range IPVSSchedulers {
		got, err := load(t, input{args: []string{"--ipvs-scheduler", name}})
		if err != nil {
			t.Errorf("--ipvs-scheduler %s: %v", name, err)
		} else if got.IPVS.Scheduler != name {
			t.Errorf("--ipvs-scheduler %s: scheduler %q", name, got.IPVS.Scheduler)
		}
	}
}

// TestDocsExample loads the first YAML example of docs/configuration.md, so the
// reference cannot drift from the code.
func TestDocsExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatalf("configuration reference: %v", err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no ```yaml block in docs/configuration.md")
	}
	got, err := load(t, input{yaml: example})
	if err != nil {
		t.Fatalf("the documented example does not load: %v", err)
	}
	if got.Mode != "nftables" || got.NodePortAddresses.Primary != true || len(got.ClusterCIDRs) != 2 {
		t.Errorf("example loaded as %+v", got)
	}
}
