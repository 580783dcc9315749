package diagnose

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends/iptables"
)

// healthyNode is a fake /proc and /sys tree of a node with nothing wrong:
// paths under the tree's root, and their contents.
var healthyNode = map[string]string{
	"proc/sys/net/ipv4/ip_forward":                 "1\n",
	"proc/sys/net/ipv6/conf/all/forwarding":        "1\n",
	"proc/sys/net/ipv4/conf/all/route_localnet":    "1\n",
	"proc/sys/net/ipv4/conf/all/rp_filter":         "2\n",
	"proc/sys/net/ipv4/conf/eth0/rp_filter":        "1\n",
	"proc/sys/net/netfilter/nf_conntrack_count":    "10\n",
	"proc/sys/net/netfilter/nf_conntrack_max":      "1000\n",
	"proc/sys/net/bridge/bridge-nf-call-iptables":  "1\n",
	"proc/sys/net/bridge/bridge-nf-call-ip6tables": "1\n",
	"proc/thread-self/net/ip_tables_names":         "",
	"proc/thread-self/net/ip6_tables_names":        "",
	"proc/thread-self/net/ip_vs":                   "IP Virtual Server version 1.2.1 (size=4096)\n",
	"sys/class/net/eth0/address":                   "02:00:00:00:00:01\n",
	"sys/class/net/lo/address":                     "00:00:00:00:00:00\n",
}

// fakeNode writes healthyNode with changes (a "-" value removes the file)
// under a temporary directory and returns a check of it with opts.
func fakeNode(t *testing.T, opts NodeOptions, changes map[string]string) *nodeCheck {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{}
	for p, v := range healthyNode {
		files[p] = v
	}
	for p, v := range changes {
		if v == "-" {
			delete(files, p)
		} else {
			files[p] = v
		}
	}
	for p, v := range files {
		path := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts.ProcRoot, opts.SysRoot = filepath.Join(root, "proc"), filepath.Join(root, "sys")
	return newNodeCheck(context.Background(), opts)
}

// verdicts lists the findings as "code severity", in order.
func verdicts(fs []Finding) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.Code+" "+f.Severity.String())
	}
	return out
}

// checkFindings fails unless fs are want ("code severity"), each a node
// finding with a message.
func checkFindings(t *testing.T, fs []Finding, want ...string) {
	t.Helper()
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Errorf("findings %q, want %q", got, want)
		for _, f := range fs {
			t.Logf("  %s", f)
		}
	}
	for _, f := range fs {
		if f.Subject != "node" || f.Message == "" || !strings.HasPrefix(f.Code, "node.") {
			t.Errorf("finding %+v: want Subject node, a node.* code and a message", f)
		}
	}
}

// bridgeDir is a file that makes br0 a bridge in a fake tree.
const bridgeDir = "sys/class/net/br0/bridge/bridge_id"

func TestNodeSysctls(t *testing.T) {
	usage := "node.conntrack-usage info"
	for _, tc := range []struct {
		name    string
		opts    NodeOptions
		changes map[string]string
		want    []string
	}{
		{name: "healthy", want: []string{usage}},
		{name: "healthy dual-stack with localhost node ports and a bridge",
			opts:    NodeOptions{Mode: "nftables", DualStack: true, LocalhostNodePorts: true},
			changes: map[string]string{bridgeDir: "8000.0"}, want: []string{usage}},
		{name: "ip_forward off", changes: map[string]string{"proc/sys/net/ipv4/ip_forward": "0\n"},
			want: []string{"node.ip-forward-off broken", usage}},
		{name: "IPv6 forwarding off, single-stack", changes: map[string]string{"proc/sys/net/ipv6/conf/all/forwarding": "0"},
			want: []string{usage}},
		{name: "IPv6 forwarding off, dual-stack", opts: NodeOptions{DualStack: true},
			changes: map[string]string{"proc/sys/net/ipv6/conf/all/forwarding": "0"},
			want:    []string{"node.ipv6-forward-off broken", usage}},
		{name: "IPv6 disabled, dual-stack", opts: NodeOptions{DualStack: true},
			changes: map[string]string{"proc/sys/net/ipv6/conf/all/forwarding": "-"},
			want:    []string{"node.check-failed warning", usage}},
		{name: "ip_forward unreadable", changes: map[string]string{"proc/sys/net/ipv4/ip_forward": "yes"},
			want: []string{"node.check-failed warning", usage}},
		{name: "route_localnet off, localhost node ports", opts: NodeOptions{Mode: "nftables", LocalhostNodePorts: true},
			changes: map[string]string{"proc/sys/net/ipv4/conf/all/route_localnet": "0"},
			want:    []string{"node.route-localnet-off warning", usage}},
		{name: "route_localnet off, iptables", opts: NodeOptions{Mode: "iptables", LocalhostNodePorts: true},
			changes: map[string]string{"proc/sys/net/ipv4/conf/all/route_localnet": "0"},
			want:    []string{"node.route-localnet-off warning", usage}},
		{name: "route_localnet off, no localhost node ports", opts: NodeOptions{Mode: "nftables"},
			changes: map[string]string{"proc/sys/net/ipv4/conf/all/route_localnet": "0"}, want: []string{usage}},
		{name: "route_localnet off, ipvs serves none on loopback", opts: NodeOptions{Mode: "ipvs", LocalhostNodePorts: true},
			changes: map[string]string{"proc/sys/net/ipv4/conf/all/route_localnet": "0"}, want: []string{usage}},
		{name: "bridge, br_netfilter missing",
			changes: map[string]string{bridgeDir: "8000.0", "proc/sys/net/bridge/bridge-nf-call-iptables": "-",
				"proc/sys/net/bridge/bridge-nf-call-ip6tables": "-"},
			want: []string{"node.bridge-nf-call-iptables-off warning", usage}},
		{name: "bridge, br_netfilter missing, dual-stack: one finding", opts: NodeOptions{DualStack: true},
			changes: map[string]string{bridgeDir: "8000.0", "proc/sys/net/bridge/bridge-nf-call-iptables": "-",
				"proc/sys/net/bridge/bridge-nf-call-ip6tables": "-"},
			want: []string{"node.bridge-nf-call-iptables-off warning", usage}},
		{name: "bridge, bridge-nf-call-iptables 0",
			changes: map[string]string{bridgeDir: "8000.0", "proc/sys/net/bridge/bridge-nf-call-iptables": "0"},
			want:    []string{"node.bridge-nf-call-iptables-off warning", usage}},
		{name: "bridge, bridge-nf-call-ip6tables 0, dual-stack", opts: NodeOptions{DualStack: true},
			changes: map[string]string{bridgeDir: "8000.0", "proc/sys/net/bridge/bridge-nf-call-ip6tables": "0"},
			want:    []string{"node.bridge-nf-call-ip6tables-off warning", usage}},
		{name: "no bridge, br_netfilter missing",
			changes: map[string]string{"proc/sys/net/bridge/bridge-nf-call-iptables": "-"}, want: []string{usage}},
		{name: "rp_filter strict", changes: map[string]string{"proc/sys/net/ipv4/conf/all/rp_filter": "1"},
			want: []string{"node.rp-filter-strict warning", usage}},
		{name: "rp_filter off", changes: map[string]string{"proc/sys/net/ipv4/conf/all/rp_filter": "0"}, want: []string{usage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeNode(t, tc.opts, tc.changes)
			fs := slices.Concat(c.forwarding(), c.routeLocalnet(), c.bridgeNF(), c.rpFilter(), c.conntrack())
			checkFindings(t, fs, tc.want...)
		})
	}
}

func TestNodeFindingsSayWhatToDo(t *testing.T) {
	c := fakeNode(t, NodeOptions{Mode: "nftables", LocalhostNodePorts: true}, map[string]string{
		"proc/sys/net/ipv4/ip_forward":                "0",
		"proc/sys/net/ipv4/conf/all/route_localnet":   "0",
		"proc/sys/net/ipv4/conf/all/rp_filter":        "1",
		"sys/class/net/cni0/bridge/bridge_id":         "8000.0",
		bridgeDir:                                     "8000.0",
		"proc/sys/net/bridge/bridge-nf-call-iptables": "0",
	})
	fs := slices.Concat(c.forwarding(), c.routeLocalnet(), c.bridgeNF(), c.rpFilter())
	for i, want := range []string{
		"net.ipv4.ip_forward is 0: this node does not forward packets, so connections to services whose endpoints run on other nodes or in pods are dropped; set it to 1 (sysctl -w net.ipv4.ip_forward=1)",
		"sysctl -w net.ipv4.conf.all.route_localnet=1",
		"bridges br0 and cni0 exist and net.bridge.bridge-nf-call-iptables is 0",
		"sysctl -w net.ipv4.conf.all.rp_filter=2",
	} {
		if i >= len(fs) || !strings.Contains(fs[i].Message, want) {
			t.Errorf("finding %d does not say %q; findings:\n%v", i, want, fs)
		}
	}
}

func TestNodeConntrack(t *testing.T) {
	for _, tc := range []struct {
		count, limit string
		want         string
	}{
		{"10", "1000", "node.conntrack-usage info"},
		{"899", "1000", "node.conntrack-usage info"},
		{"900", "1000", "node.conntrack-nearly-full warning"},
		{"999", "1000", "node.conntrack-nearly-full warning"},
		{"1000", "1000", "node.conntrack-full broken"},
		{"1200", "1000", "node.conntrack-full broken"},
		{"5", "0", "node.conntrack-usage info"},
		{"-", "1000", "node.conntrack-missing warning"},
		{"10", "-", "node.conntrack-missing warning"},
		{"ten", "1000", "node.check-failed warning"},
	} {
		t.Run(tc.count+"/"+tc.limit, func(t *testing.T) {
			c := fakeNode(t, NodeOptions{}, map[string]string{
				"proc/sys/net/netfilter/nf_conntrack_count": tc.count,
				"proc/sys/net/netfilter/nf_conntrack_max":   tc.limit,
			})
			checkFindings(t, c.conntrack(), tc.want)
		})
	}
	c := fakeNode(t, NodeOptions{}, map[string]string{"proc/sys/net/netfilter/nf_conntrack_count": "250"})
	if fs := c.conntrack(); len(fs) != 1 || !strings.Contains(fs[0].Message, "250 of 1000 entries in use (25%)") {
		t.Errorf("usage finding %v does not give the figures", fs)
	}
}

func TestNodeKernelVersion(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release error
		atLeast bool
		cmpErr  error
		want    string
	}{
		{name: "supported", atLeast: true, want: "node.kernel info"},
		{name: "too old", want: "node.kernel-unsupported broken"},
		{name: "no release", release: errors.New("uname: no"), want: "node.check-failed warning"},
		{name: "unreadable version", cmpErr: errors.New("cannot read"), want: "node.check-failed warning"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeNode(t, NodeOptions{}, nil)
			c.release = func() (string, error) { return "5.15.0-91-generic", tc.release }
			c.atLeast = func(v string) (bool, error) { return tc.atLeast, tc.cmpErr }
			fs := c.kernel()
			checkFindings(t, fs, tc.want)
			if tc.release == nil && tc.cmpErr == nil && !strings.Contains(fs[0].Message, "5.15.0-91-generic") {
				t.Errorf("%v does not name the release", fs[0])
			}
		})
	}
}

func TestNodeFeatures(t *testing.T) {
	if !iptables.Installed("nft") {
		t.Skip("needs the iptables-nft binaries")
	}
	noIPVS := map[string]string{"proc/thread-self/net/ip_vs": "-"}
	for _, tc := range []struct {
		name    string
		opts    NodeOptions
		changes map[string]string
		want    []string
	}{
		{name: "iptables nft", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "nft"}},
		{name: "iptables, flavour unknown", opts: NodeOptions{Mode: "iptables"}},
		{name: "iptables, a flavour not installed", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "none"},
			want: []string{"node.iptables-missing broken"}},
		{name: "ipvs", opts: NodeOptions{Mode: "ipvs", IptablesFlavour: "nft"}},
		{name: "ipvs without ip_vs", opts: NodeOptions{Mode: "ipvs", IptablesFlavour: "nft"}, changes: noIPVS,
			want: []string{"node.ipvs-missing broken"}},
		{name: "ipvs without anything", opts: NodeOptions{Mode: "ipvs", IptablesFlavour: "none"}, changes: noIPVS,
			want: []string{"node.iptables-missing broken", "node.ipvs-missing broken"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkFindings(t, fakeNode(t, tc.opts, tc.changes).features(), tc.want...)
		})
	}
}

func TestNodeOtherProxyChains(t *testing.T) {
	both := map[string][]string{"nft": {"IPv4"}, "legacy": {"IPv4", "IPv6"}}
	for _, tc := range []struct {
		name   string
		opts   NodeOptions
		chains map[string][]string // per flavour, the families with KUBE-SERVICES
		looked []string            // the flavours looked at
		want   []string
	}{
		{name: "nftables mode, none", opts: NodeOptions{Mode: "nftables"}, looked: []string{"nft", "legacy"}},
		{name: "nftables mode, legacy chain", opts: NodeOptions{Mode: "nftables"},
			chains: map[string][]string{"legacy": {"IPv4"}}, looked: []string{"nft", "legacy"},
			want: []string{"node.other-proxy-rules broken"}},
		{name: "ipvs mode, nft chain: Weir's ipvs mode names its chains WEIR-", opts: NodeOptions{Mode: "ipvs", IptablesFlavour: "nft"},
			chains: map[string][]string{"nft": {"IPv4"}}, looked: []string{"nft", "legacy"},
			want: []string{"node.other-proxy-rules broken"}},
		{name: "iptables nft, its own chain", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "nft"},
			chains: map[string][]string{"nft": {"IPv4"}}, looked: []string{"legacy"}},
		{name: "iptables nft, legacy chain too", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "nft"},
			chains: both, looked: []string{"legacy"}, want: []string{"node.other-proxy-rules broken"}},
		{name: "iptables legacy, nft chain", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "legacy"},
			chains: both, looked: []string{"nft"}, want: []string{"node.other-proxy-rules broken"}},
		{name: "iptables, flavour unknown, one chain", opts: NodeOptions{Mode: "iptables"},
			chains: map[string][]string{"legacy": {"IPv4"}}, looked: []string{"nft", "legacy"}},
		{name: "iptables, flavour auto, both", opts: NodeOptions{Mode: "iptables", IptablesFlavour: "auto"},
			chains: both, looked: []string{"nft", "legacy"}, want: []string{"node.other-proxy-rules broken"}},
		{name: "a flavour cannot be read", opts: NodeOptions{Mode: "nftables"},
			chains: map[string][]string{"legacy": nil}, looked: []string{"nft", "legacy"},
			want: []string{"node.check-failed warning"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeNode(t, tc.opts, nil)
			var looked []string
			c.natServices = func(fl string) ([]string, error) {
				looked = append(looked, fl)
				if fams, ok := tc.chains[fl]; ok && fams == nil {
					return nil, errors.New("save failed")
				}
				return tc.chains[fl], nil
			}
			checkFindings(t, c.kubeProxyChains(), tc.want...)
			if !slices.Equal(looked, tc.looked) {
				t.Errorf("looked at flavours %v, want %v", looked, tc.looked)
			}
		})
	}
}

func TestNodeLegacyChainsReadOnly(t *testing.T) {
	bin := t.TempDir()
	ran := filepath.Join(bin, "ran")
	// A fake iptables-legacy-save that records its arguments.
	script := "#!/bin/sh\necho \"$@\" >> " + ran + "\necho '*nat'\necho ':PREROUTING ACCEPT [0:0]'\necho ':KUBE-SERVICES - [0:0]'\necho COMMIT\n"
	for _, name := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	c := fakeNode(t, NodeOptions{}, map[string]string{"proc/thread-self/net/ip_tables_names": "filter\nnat\n",
		"proc/thread-self/net/ip6_tables_names": "filter\n"})
	fams, err := c.servicesChain("legacy")
	if err != nil || !slices.Equal(fams, []string{"IPv4"}) {
		t.Errorf("servicesChain(legacy) = %v, %v; want [IPv4]", fams, err)
	}
	// The IPv6 nat table does not exist: saving it would create it.
	if b, _ := os.ReadFile(ran); string(b) != "-t nat\n" {
		t.Errorf("the save tools ran with %q, want once with -t nat", b)
	}

	c = fakeNode(t, NodeOptions{}, map[string]string{"proc/thread-self/net/ip_tables_names": "-",
		"proc/thread-self/net/ip6_tables_names": "-"})
	if fams, err := c.servicesChain("legacy"); err != nil || len(fams) != 0 {
		t.Errorf("no x_tables: servicesChain(legacy) = %v, %v; want nothing", fams, err)
	}
}

func TestNodeKubeIPVSInterface(t *testing.T) {
	withIface := map[string]string{"sys/class/net/kube-ipvs0/address": "00"}
	for _, tc := range []struct {
		name    string
		opts    NodeOptions
		changes map[string]string
		want    []string
	}{
		{name: "none", opts: NodeOptions{Mode: "nftables"}},
		{name: "nftables mode", opts: NodeOptions{Mode: "nftables"}, changes: withIface,
			want: []string{"node.other-proxy-rules broken"}},
		{name: "ipvs mode, Weir's own interface elsewhere", opts: NodeOptions{Mode: "ipvs"}, changes: withIface,
			want: []string{"node.other-proxy-rules broken"}},
		{name: "ipvs mode, Weir's interface named so", opts: NodeOptions{Mode: "ipvs", IPVSInterface: "kube-ipvs0"},
			changes: withIface},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkFindings(t, fakeNode(t, tc.opts, tc.changes).kubeProxyInterface(), tc.want...)
		})
	}
}

func TestNodeServers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	listening := ln.Addr().String()
	_, port, _ := net.SplitHostPort(listening)
	// A port nothing listens on: one just closed.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	idle := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name            string
		healthz, metric string
		want            []string
	}{
		{name: "both off"},
		{name: "both listening", healthz: listening, metric: "0.0.0.0:" + port},
		{name: "healthz idle", healthz: idle, metric: listening, want: []string{"node.healthz-not-listening warning"}},
		{name: "metrics idle", healthz: listening, metric: idle, want: []string{"node.metrics-not-listening warning"}},
		{name: "bad address", healthz: "10256", want: []string{"node.check-failed warning"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeNode(t, NodeOptions{HealthzAddress: tc.healthz, MetricsAddress: tc.metric}, nil)
			fs := c.servers()
			checkFindings(t, fs, tc.want...)
			if len(tc.want) == 1 && strings.HasSuffix(tc.want[0], "listening warning") &&
				!strings.Contains(fs[0].Message, "nothing listens on "+idle) {
				t.Errorf("%v does not say that nothing listens on %s", fs[0], idle)
			}
		})
	}
}

func TestDialTarget(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:10256":  "127.0.0.1:10256",
		":10256":         "127.0.0.1:10256",
		"[::]:10256":     "[::1]:10256",
		"10.0.0.5:10249": "10.0.0.5:10249",
		"[fd00::1]:9":    "[fd00::1]:9",
	} {
		if got, err := dialTarget(addr); err != nil || got != want {
			t.Errorf("dialTarget(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}

func TestChainDeclared(t *testing.T) {
	save := []byte("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES-X - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
	if chainDeclared(save, "KUBE-SERVICES") {
		t.Error("a jump or a longer chain name counted as the chain")
	}
	if !chainDeclared(append(save, ":KUBE-SERVICES - [0:0]\n"...), "KUBE-SERVICES") {
		t.Error("the declared chain was not found")
	}
}
