package diagnose

import (
	"context"
	"net"
	"slices"
	"testing"

	"github.com/weirproxy/weir/test/netns"
)

// nodeIn runs CheckNode on the namespace ns with opts and returns its
// findings as "code severity", failing the test on a finding that is not
// about the node.
func nodeIn(t *testing.T, ns *netns.Namespace, opts NodeOptions) []string {
	t.Helper()
	opts.NetNS = ns.Fd()
	fs := CheckNode(context.Background(), opts)
	for _, f := range fs {
		if f.Subject != "node" || f.Message == "" {
			t.Errorf("finding %+v: want Subject node and a message", f)
		}
	}
	return verdicts(fs)
}

// run runs a command in ns and fails the test if it fails.
func run(t *testing.T, ns *netns.Namespace, name string, args ...string) {
	t.Helper()
	if out, err := ns.Command(context.Background(), name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v in %s: %v: %s", name, args, ns.Name, err, out)
	}
}

// wantVerdict fails unless got has want (present) or lacks it.
func wantVerdict(t *testing.T, what string, got []string, want string, present bool) {
	t.Helper()
	if slices.Contains(got, want) != present {
		t.Errorf("%s: findings %q; want %q present: %v", what, got, want, present)
	}
}

func TestNodeInNetns(t *testing.T) {
	topo := netns.NewT(t, netns.Options{})
	node := topo.Node
	nft := NodeOptions{Mode: "nftables"}

	t.Run("features and conntrack", func(t *testing.T) {
		got := nodeIn(t, node, nft)
		for _, bad := range []string{"node.nftables-unavailable broken", "node.check-failed warning", "node.other-proxy-rules broken"} {
			wantVerdict(t, "a fresh namespace", got, bad, false)
		}
		wantVerdict(t, "a fresh namespace", got, "node.kernel info", true)
		wantVerdict(t, "a fresh namespace", got, "node.conntrack-usage info", true)
	})

	t.Run("ip_forward", func(t *testing.T) {
		// Each value is checked both ways, whatever the caller's
		// namespace holds: the finding follows the node's value.
		for _, v := range []string{"0", "1", "0", "1"} {
			if err := node.Sysctl("net.ipv4.ip_forward", v); err != nil {
				t.Fatal(err)
			}
			wantVerdict(t, "ip_forward="+v, nodeIn(t, node, nft), "node.ip-forward-off broken", v == "0")
		}
		if err := node.Sysctl("net.ipv6.conf.all.forwarding", "0"); err != nil {
			t.Fatal(err)
		}
		wantVerdict(t, "IPv6 forwarding 0, dual-stack", nodeIn(t, node, NodeOptions{Mode: "nftables", DualStack: true}),
			"node.ipv6-forward-off broken", true)
		wantVerdict(t, "IPv6 forwarding 0, single-stack", nodeIn(t, node, nft), "node.ipv6-forward-off broken", false)
		if err := node.Sysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("route_localnet", func(t *testing.T) {
		lnp := NodeOptions{Mode: "nftables", LocalhostNodePorts: true}
		wantVerdict(t, "route_localnet 0", nodeIn(t, node, lnp), "node.route-localnet-off warning", true)
		if err := node.Sysctl("net.ipv4.conf.all.route_localnet", "1"); err != nil {
			t.Fatal(err)
		}
		wantVerdict(t, "route_localnet 1", nodeIn(t, node, lnp), "node.route-localnet-off warning", false)
	})

	t.Run("servers", func(t *testing.T) {
		var ln net.Listener
		err := node.Do(func() (err error) {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		opts := NodeOptions{Mode: "nftables", HealthzAddress: "0.0.0.0:" + port, MetricsAddress: "127.0.0.1:" + port}
		got := nodeIn(t, node, opts)
		wantVerdict(t, "listening in the namespace", got, "node.healthz-not-listening warning", false)
		wantVerdict(t, "listening in the namespace", got, "node.metrics-not-listening warning", false)
		ln.Close()
		got = nodeIn(t, node, opts)
		wantVerdict(t, "nothing listening", got, "node.healthz-not-listening warning", true)
		wantVerdict(t, "nothing listening", got, "node.metrics-not-listening warning", true)
	})

	t.Run("kube-proxy's nftables table", func(t *testing.T) {
		run(t, node, "nft", "add", "table", "ip", "kube-proxy")
		defer run(t, node, "nft", "delete", "table", "ip", "kube-proxy")
		for _, tc := range []struct {
			opts NodeOptions
			want bool
		}{
			{nft, true},
			{NodeOptions{Mode: "iptables", IptablesFlavour: "nft"}, true},
			{NodeOptions{Mode: "nftables", NFTablesTable: "kube-proxy"}, false}, // Weir's own
		} {
			wantVerdict(t, "ip kube-proxy, "+tc.opts.Mode+" "+tc.opts.NFTablesTable, nodeIn(t, node, tc.opts),
				"node.other-proxy-rules broken", tc.want)
		}
	})

	t.Run("kube-proxy's iptables chains", func(t *testing.T) {
		for _, tc := range []struct {
			flavour string
			others  []NodeOptions // modes that see another proxy
			own     NodeOptions   // the mode that takes the chain for Weir's
		}{
			{"nft",
				[]NodeOptions{nft, {Mode: "ipvs", IptablesFlavour: "nft"}, {Mode: "iptables", IptablesFlavour: "legacy"}},
				NodeOptions{Mode: "iptables", IptablesFlavour: "nft"}},
			{"legacy",
				[]NodeOptions{nft, {Mode: "iptables", IptablesFlavour: "nft"}},
				NodeOptions{Mode: "iptables", IptablesFlavour: "legacy"}},
		} {
			tool := "iptables-" + tc.flavour
			run(t, node, tool, "-t", "nat", "-N", "KUBE-SERVICES")
			for _, o := range tc.others {
				wantVerdict(t, tool+" KUBE-SERVICES, "+o.Mode+" "+o.IptablesFlavour, nodeIn(t, node, o),
					"node.other-proxy-rules broken", true)
			}
			wantVerdict(t, tool+" KUBE-SERVICES, Weir's own", nodeIn(t, node, tc.own), "node.other-proxy-rules broken", false)
			wantVerdict(t, tool+" KUBE-SERVICES, flavour unknown", nodeIn(t, node, NodeOptions{Mode: "iptables"}),
				"node.other-proxy-rules broken", false)
			run(t, node, tool, "-t", "nat", "-X", "KUBE-SERVICES")
		}
		for _, tool := range []string{"iptables-nft", "iptables-legacy"} {
			run(t, node, tool, "-t", "nat", "-N", "KUBE-SERVICES")
			defer run(t, node, tool, "-t", "nat", "-X", "KUBE-SERVICES")
		}
		wantVerdict(t, "KUBE-SERVICES in both flavours, flavour unknown", nodeIn(t, node, NodeOptions{Mode: "iptables"}),
			"node.other-proxy-rules broken", true)
	})
}
