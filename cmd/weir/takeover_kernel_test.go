package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// staleKubeProxy is what a stopped kube-proxy leaves on a node that ran it
// in nftables mode and, before that, in iptables mode with either
// flavour: each sends the demo's web service to pod-c only, and each hooks
// before Weir's rules.
var staleKubeProxy = []struct{ tool, text string }{
	{"nft", `add table ip kube-proxy
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat - 10; }
add rule ip kube-proxy nat-prerouting ip daddr 10.96.0.10 tcp dport 80 dnat to 10.244.0.13:8080
add table ip6 kube-proxy
`},
	{"iptables-legacy-restore", staleServices},
	{"iptables-nft-restore", staleServices},
}

const staleServices = `*nat
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.0.13:8080
COMMIT
`

// TestKernelTakeover switches a node from a stopped kube-proxy, whose
// rules still serve, to weir run with takeover: true in nftables mode.
// After Weir's first commit its takeover removes kube-proxy's nftables
// tables and its iptables chains of both flavours, so Weir's rules serve
// every endpoint, where kube-proxy's stale ones sent everything to one.
func TestKernelTakeover(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	for _, s := range staleKubeProxy {
		args := []string{"-f", "-"}
		if s.tool != "nft" {
			args = []string{"--noflush"}
		}
		cmd := topo.Node.Command(context.Background(), s.tool, args...)
		cmd.Stdin = strings.NewReader(s.text)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", s.tool, err, out)
		}
	}
	netns.WantPods(t, "kube-proxy's stale rules", netns.DialMany(t, topo.Client, webVIP, 10), "pod-c")

	d := startDaemon(t, topo.Node, weir, "run", "--source-path", dir, "--node-name", demoNode, "--takeover")
	d.waitLog(t, "Took over from kube-proxy", 30*time.Second)
	netns.WantPods(t, "after the takeover", netns.DialMany(t, topo.Client, webVIP, 60), "pod-a", "pod-b", "pod-c")
	if out := nodeOutput(t, topo.Node, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") {
		t.Errorf("kube-proxy's tables are left:\n%s", out)
	}
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		if out := nodeOutput(t, topo.Node, save, "-t", "nat"); strings.Contains(out, "KUBE-") {
			t.Errorf("%s: kube-proxy's chains are left:\n%s", save, out)
		}
	}
}

// nodeOutput runs a command in ns and returns what it prints.
func nodeOutput(t *testing.T, ns *netns.Namespace, name string, args ...string) string {
	t.Helper()
	out, err := ns.Command(context.Background(), name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}
