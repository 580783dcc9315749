package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestBadValues(t *testing.T) {
	tests := []struct {
		in      input
		key     string
		value   string
		source  string // "file" stands for "file <the temporary path>"
		allowed string // a part of Error.Allowed
	}{
		{input{args: []string{"--mode=nftable"}}, "mode", "nftable", "flag --mode", "one of nftables, iptables, ipvs"},
		{input{yaml: "mode: [nftables]\n"}, "mode", "[nftables]", "file", "one of nftables"},
		{input{env: []string{"WEIR_NODE_NAME=node_1"}}, "nodeName", "node_1", "environment WEIR_NODE_NAME", "DNS name"},
		{input{env: []string{"WEIR_NODE_NAME="}}, "nodeName", "", "environment WEIR_NODE_NAME", "DNS name"},
		{input{yaml: "source:\n  kind: k8s\n"}, "source.kind", "k8s", "file", "one of files, kubernetes"},
		{input{env: []string{"WEIR_SOURCE_PATH= "}}, "source.path", " ", "environment WEIR_SOURCE_PATH", "folder path"},
		{input{yaml: "source: {kubeconfig: [a, b]}\n"}, "source.kubeconfig", "[a, b]", "file", "in-cluster"},
		{input{env: []string{"WEIR_CLUSTER_CIDRS=10.0.0.0/8,10.0.0.0/33"}}, "clusterCIDRs", "10.0.0.0/33", "environment WEIR_CLUSTER_CIDRS", "CIDRs such as"},
		{input{yaml: "clusterCIDRs: [10.0.0.1]\n"}, "clusterCIDRs", "10.0.0.1", "file", "CIDRs such as"},
		{input{yaml: "clusterCIDRs: {a: 1}\n"}, "clusterCIDRs", "{a: 1}", "file", "CIDRs such as"},
		{input{args: []string{"--local-detector=PodCIDR"}}, "localDetector.mode", "PodCIDR", "flag --local-detector", "one of ClusterCIDR, NodeCIDR, InterfaceNamePrefix"},
		{input{yaml: "localDetector: {mode: InterfaceNamePrefix}\n"}, "localDetector.interfaceNamePrefix", "", "default", "localDetector.mode is InterfaceNamePrefix"},
		{input{env: []string{"WEIR_LOCAL_DETECTOR_INTERFACE_NAME_PREFIX=a/b"}}, "localDetector.interfaceNamePrefix", "a/b", "environment WEIR_LOCAL_DETECTOR_INTERFACE_NAME_PREFIX", "interface name prefix"},
		{input{env: []string{"WEIR_MASQUERADE_ALL=maybe"}}, "masqueradeAll", "maybe", "environment WEIR_MASQUERADE_ALL", "true or false"},
		{input{args: []string{"--masquerade-all=yes"}}, "masqueradeAll", "yes", "flag --masquerade-all", "true or false"},
		{input{yaml: "nodePortAddresses: [primary, 10.0.0.0/8]\n"}, "nodePortAddresses", "[primary, 10.0.0.0/8]", "file", "single word primary"},
		{input{args: []string{"--node-port-addresses=eth0"}}, "nodePortAddresses", "eth0", "flag --node-port-addresses", "single word primary"},
		{input{yaml: "nodePortRange: 32767-30000\n"}, "nodePortRange", "32767-30000", "file", "FIRST-LAST"},
		{input{args: []string{"--node-port-range=30000"}}, "nodePortRange", "30000", "flag --node-port-range", "such as 30000-32767"},
		{input{env: []string{"WEIR_NODE_PORT_RANGE=0-100"}}, "nodePortRange", "0-100", "environment WEIR_NODE_PORT_RANGE", "1 <= FIRST"},
		{input{env: []string{"WEIR_SYNC_PERIOD=0s"}}, "syncPeriod", "0s", "environment WEIR_SYNC_PERIOD", "greater than zero"},
		{input{yaml: "syncPeriod: 30\n"}, "syncPeriod", "30", "file", "such as 30s"},
		{input{args: []string{"--sync-period=soon"}}, "syncPeriod", "soon", "flag --sync-period", "greater than zero"},
		{input{env: []string{"WEIR_MIN_SYNC_PERIOD=-1s"}}, "minSyncPeriod", "-1s", "environment WEIR_MIN_SYNC_PERIOD", "zero or more"},
		{input{yaml: "conntrack:\n  min: -1\n"}, "conntrack.min", "-1", "file", "whole number of zero or more"},
		{input{args: []string{"--conntrack-max-per-core=lots"}}, "conntrack.maxPerCore", "lots", "flag --conntrack-max-per-core", "such as 0 or 32768"},
		{input{yaml: "serviceCIDRs: [10.96.0.0/33]\n"}, "serviceCIDRs", "10.96.0.0/33", "file", "CIDRs such as"},
		{input{args: []string{"--min-sync-period=40s"}}, "minSyncPeriod", "40s", "flag --min-sync-period", "no longer than syncPeriod (30s, from default)"},
		{input{yaml: "syncPeriod: 1s\n", env: []string{"WEIR_MIN_SYNC_PERIOD=2s"}}, "minSyncPeriod", "2s", "environment WEIR_MIN_SYNC_PERIOD", "no longer than syncPeriod (1s, from file "},
		{input{args: []string{"--metrics-bind-address=localhost:10249"}}, "metricsBindAddress", "localhost:10249", "flag --metrics-bind-address", "IP address and port"},
		{input{env: []string{"WEIR_METRICS_BIND_ADDRESS=127.0.0.1:99999"}}, "metricsBindAddress", "127.0.0.1:99999", "environment WEIR_METRICS_BIND_ADDRESS", "IP address and port"},
		{input{yaml: "healthzBindAddress: 0.0.0.0\n"}, "healthzBindAddress", "0.0.0.0", "file", "IP address and port"},
		{input{env: []string{"WEIR_LOG_FORMAT=yaml"}}, "log.format", "yaml", "environment WEIR_LOG_FORMAT", "one of text, json"},
		{input{args: []string{"--log-level=verbose"}}, "log.level", "verbose", "flag --log-level", "one of debug, info, warn, error"},
		{input{args: []string{"--nftables-table=weir table"}}, "nftables.table", "weir table", "flag --nftables-table", "1 to 32"},
		{input{env: []string{"WEIR_NFTABLES_TABLE=" + strings.Repeat("w", 33)}}, "nftables.table", strings.Repeat("w", 33), "environment WEIR_NFTABLES_TABLE", "1 to 32"},
		{input{args: []string{"--ipvs-scheduler=lblc"}}, "ipvs.scheduler", "lblc", "flag --ipvs-scheduler", "one of rr, wrr, lc, wlc, sh, dh, sed, nq, mh"},
		{input{yaml: "ipvs: {scheduler: \"\"}\n"}, "ipvs.scheduler", "", "file", "one of rr, wrr"},
		{input{env: []string{"WEIR_IPVS_STRICT_ARP=on"}}, "ipvs.strictARP", "on", "environment WEIR_IPVS_STRICT_ARP", "true or false"},
		{input{env: []string{"WEIR_IPVS_GRACE_PERIOD=0s"}}, "ipvs.gracePeriod", "0s", "environment WEIR_IPVS_GRACE_PERIOD", "greater than zero"},
		{input{args: []string{"--ipvs-grace-period=-1m"}}, "ipvs.gracePeriod", "-1m", "flag --ipvs-grace-period", "greater than zero"},
		{input{yaml: "ipvs:\n  gracePeriod: 900\n"}, "ipvs.gracePeriod", "900", "file", "such as 30s"},
		{input{args: []string{"--ipvs-interface=weir-ipvs-dummy0"}}, "ipvs.interface", "weir-ipvs-dummy0", "flag --ipvs-interface", "1 to 15 characters"},
		{input{env: []string{"WEIR_IPVS_INTERFACE=eth0:1"}}, "ipvs.interface", "eth0:1", "environment WEIR_IPVS_INTERFACE", "interface name"},
		{input{yaml: "ipvs: {interface: \"\"}\n"}, "ipvs.interface", "", "file", "interface name"},
		{input{yaml: "plugins: [a, b]\n"}, "plugins", "[a, b]", "file", "list of mappings"},
		{input{yaml: "plugins: {name: a}\n"}, "plugins", "{name: a}", "file", "list of mappings"},
		{input{yaml: "source: files\n"}, "source", "files", "file", "a mapping with the keys kind, path, kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			_, err := load(t, tc.in)
			e, ok := err.(*Error) //nolint:errorlint // Load must return the *Error itself, not a wrapper or a join
			if !ok {
				t.Fatalf("err = %v (%T), want one *Error", err, err)
			}
			source := tc.source
			if source == "file" {
				source = e.Source // checked below to start with "file /"
				if !strings.HasPrefix(source, "file /") {
					t.Errorf("Source = %q, want file <path>", source)
				}
			}
			if e.Key != tc.key || e.Value != tc.value || e.Source != source {
				t.Errorf("got Key %q Value %q Source %q, want %q %q %q", e.Key, e.Value, e.Source, tc.key, tc.value, source)
			}
			if !strings.Contains(e.Allowed, tc.allowed) {
				t.Errorf("Allowed = %q, want it to contain %q", e.Allowed, tc.allowed)
			}
			for _, part := range []string{tc.key + ":", `"` + tc.value + `"`, "(from " + e.Source + ")", "use " + e.Allowed} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("message %q does not contain %q", err, part)
				}
			}
		})
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name string
		in   input
		want string // the message, with FILE for the file's path
	}{
		{"typo at top level",
			input{yaml: "sycnPeriod: 10s\n"},
			`config: unknown key "sycnPeriod" in file FILE; did you mean "syncPeriod"?`},
		{"wrong case",
			input{yaml: "nodename: a\n"},
			`config: unknown key "nodename" in file FILE; did you mean "nodeName"?`},
		{"typo in a section",
			input{yaml: "source:\n  pth: /x\n"},
			`config: unknown key "source.pth" in file FILE; did you mean "source.path"?`},
		{"nothing close",
			input{yaml: "log:\n  colour: blue\n"},
			`config: unknown key "log.colour" in file FILE; known keys: format, level`},
		{"dotted key in YAML",
			input{yaml: "source.kind: files\n"},
			`config: unknown key "source.kind" in file FILE; known keys: mode, nodeName, source, clusterCIDRs, serviceCIDRs, localDetector, masqueradeAll, localhostNodePorts, nodePortAddresses, nodePortRange, takeover, syncPeriod, minSyncPeriod, metricsBindAddress, healthzBindAddress, enableProfiling, log, nftables, iptables, conntrack, ipvs, hooks, plugins`},
		{"typo in the ipvs section",
			input{yaml: "ipvs:\n  strictArp: true\n"},
			`config: unknown key "ipvs.strictArp" in file FILE; did you mean "ipvs.strictARP"?`},
		{"leaf used as a section",
			input{yaml: "nftables:\n  table: weir\n  chain: x\n"},
			`config: unknown key "nftables.chain" in file FILE; known keys: table, commentBuckets`},
		{"unknown variable",
			input{env: []string{"WEIR_SYNCPERIOD=10s"}},
			`config: unknown environment variable WEIR_SYNCPERIOD; did you mean "WEIR_SYNC_PERIOD"?`},
		{"plugins have no variable",
			input{env: []string{"WEIR_PLUGINS=a"}},
			`config: unknown environment variable WEIR_PLUGINS; known variables: WEIR_CONFIG, WEIR_MODE, WEIR_NODE_NAME, WEIR_SOURCE_KIND, WEIR_SOURCE_PATH, WEIR_SOURCE_KUBECONFIG, WEIR_CLUSTER_CIDRS, WEIR_SERVICE_CIDRS, WEIR_LOCAL_DETECTOR_MODE, WEIR_LOCAL_DETECTOR_INTERFACE_NAME_PREFIX, WEIR_MASQUERADE_ALL, WEIR_LOCALHOST_NODE_PORTS, WEIR_NODE_PORT_ADDRESSES, WEIR_NODE_PORT_RANGE, WEIR_TAKEOVER, WEIR_SYNC_PERIOD, WEIR_MIN_SYNC_PERIOD, WEIR_METRICS_BIND_ADDRESS, WEIR_HEALTHZ_BIND_ADDRESS, WEIR_ENABLE_PROFILING, WEIR_LOG_FORMAT, WEIR_LOG_LEVEL, WEIR_NFTABLES_TABLE, WEIR_NFTABLES_COMMENT_BUCKETS, WEIR_IPTABLES_BACKEND, WEIR_CONNTRACK_MAX_PER_CORE, WEIR_CONNTRACK_MIN, WEIR_CONNTRACK_TCP_ESTABLISHED_TIMEOUT, WEIR_CONNTRACK_TCP_CLOSE_WAIT_TIMEOUT, WEIR_CONNTRACK_TCP_BE_LIBERAL, WEIR_CONNTRACK_UDP_TIMEOUT, WEIR_CONNTRACK_UDP_STREAM_TIMEOUT, WEIR_IPVS_SCHEDULER, WEIR_IPVS_STRICT_ARP, WEIR_IPVS_GRACE_PERIOD, WEIR_IPVS_INTERFACE, WEIR_HOOKS_CACHE_DIR`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.in)
			e, ok := err.(*Error) //nolint:errorlint // Load must return the *Error itself, not a wrapper or a join
			if !ok {
				t.Fatalf("err = %v (%T), want one *Error", err, err)
			}
			want := strings.ReplaceAll(tc.want, "FILE", strings.TrimPrefix(e.Source, "file "))
			if err.Error() != want {
				t.Errorf("message\n got %s\nwant %s", err, want)
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	malformed := filepath.Join(dir, "malformed.yaml")
	list := filepath.Join(dir, "list.yaml")
	for path, content := range map[string]string{malformed: "mode: [nftables\n", list: "- mode\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path   string
		prefix string
		is     error
	}{
		{missing, "config: cannot read file " + missing + ": no such file or directory", fs.ErrNotExist},
		{dir, "config: cannot read file " + dir + ": is a directory", nil},
		{malformed, "config: file " + malformed + " is not valid YAML: yaml: line ", nil},
		{list, "config: file " + list + " is not valid YAML: yaml: unmarshal errors", nil},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			_, err := Load(nil, []string{"WEIR_CONFIG=" + tc.path})
			e, ok := err.(*Error) //nolint:errorlint // Load must return the *Error itself, not a wrapper or a join
			if !ok {
				t.Fatalf("err = %v (%T), want one *Error", err, err)
			}
			if !strings.HasPrefix(err.Error(), tc.prefix) {
				t.Errorf("message\n got %s\nwant %s…", err, tc.prefix)
			}
			if e.Source != "file "+tc.path || e.Value != tc.path {
				t.Errorf("Source %q Value %q, want file %s", e.Source, e.Value, tc.path)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
		})
	}
}

func TestSeveralErrorsJoined(t *testing.T) {
	_, err := load(t, input{
		yaml: "colour: blue\nmode: ipvs\n",
		env:  []string{"WEIR_MODE=x", "WEIR_LOG_LEVEL=loud"},
		args: []string{"--sync-period=0"},
	})
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("err = %v (%T), want errors.Join of several", err, err)
	}
	var keys []string
	for _, e := range joined.Unwrap() {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("%v is not an *Error", e)
		}
		keys = append(keys, ce.Key)
	}
	if got, want := strings.Join(keys, " "), "colour mode syncPeriod log.level"; got != want {
		t.Errorf("keys in error = %q, want %q", got, want)
	}
	var first *Error
	if !errors.As(err, &first) || first.Key != "colour" {
		t.Errorf("errors.As finds %v, want the unknown key first", first)
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		err  *Error
		want string
	}{
		{&Error{Key: "mode", Value: "nftable", Allowed: "one of nftables, iptables, ipvs", Source: "flag --mode"},
			`config: mode: "nftable" (from flag --mode) is not allowed; use one of nftables, iptables, ipvs`},
		{&Error{Key: "sycnPeriod", Source: "file /etc/weir/weir.yaml", Allowed: strings.Join(sections[""], ", "), kind: kindUnknownKey},
			`config: unknown key "sycnPeriod" in file /etc/weir/weir.yaml; did you mean "syncPeriod"?`},
		{&Error{Key: "nodeName", Value: "", Allowed: allowedNodeName, Source: "default"},
			`config: nodeName: "" (from default) is not allowed; use ` + allowedNodeName},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"mode", "mode", 0}, {"mdoe", "mode", 1}, {"mod", "mode", 1},
		{"sycnperiod", "syncperiod", 1}, {"kitten", "sitting", 3},
	}
	for _, tc := range tests {
		if got := distance(tc.a, tc.b); got != tc.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestFlagHelp(t *testing.T) {
	fs := pflag.NewFlagSet("weir", pflag.ContinueOnError)
	RegisterFlags(fs)
	help := fs.FlagUsages()
	for _, want := range []string{
		"--sync-period duration",
		"(default 30s)",
		"(env WEIR_SYNC_PERIOD)",
		"--masquerade-all[=true|false]",
		"--cluster-cidrs cidrs",
		"--config string",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("help does not contain %q:\n%s", want, help)
		}
	}
}
