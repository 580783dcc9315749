package main

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// TestKernelCleanupKeepKubeProxy hands a node back to kube-proxy. Weir's
// nftables tables and its iptables-legacy chains (kube-proxy's names)
// serve the demo; next to them, kube-proxy's nftables table, hooked
// first, sends the web service to pod-c only. `weir cleanup
// --keep-kube-proxy` in mode iptables removes Weir's tables and leaves
// kube-proxy's table and the KUBE-* chains, which kube-proxy's iptables
// mode takes over; without IPVS in this kernel it skips mode ipvs (the VM
// runs that part: TestVMIPVSHandBack). The web service still answers, from
// pod-c. A second run finds nothing to remove, and with nftables.table
// named as kube-proxy's table the tables stay.
func TestKernelCleanupKeepKubeProxy(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	source := []string{"--source-path", dir, "--node-name", demoNode}
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, source...)...)
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once", "--mode", "iptables", "--iptables-backend", "legacy"}, source...)...)
	feed(t, topo.Node, staleKubeProxy[0].text, "nft", "-f", "-")
	kubeChains := kubeLines(nodeOutput(t, topo.Node, "iptables-legacy-save"))
	netns.WantPods(t, "before the hand-back", netns.DialMany(t, topo.Client, webVIP, 10), "pod-c")

	args := []string{"cleanup", "--keep-kube-proxy", "--mode", "iptables", "--iptables-backend", "legacy", "--node-name", demoNode}
	out := runWeirOutput(t, topo.Node, weir, 0, args...)
	logged := []string{
		`msg="Removed Weir's own rules" what="nftables tables" removed="ip weir, ip6 weir"`,
		`msg="Left the iptables chains to kube-proxy: Weir's carry kube-proxy's names, and its iptables mode took them over on its first sync" flavour=legacy`,
	}
	if !ipvsInKernel() {
		logged = append(logged, "Skipping mode ipvs: this kernel has no IPVS")
	}
	for _, want := range logged {
		if !strings.Contains(out, want) {
			t.Errorf("weir cleanup --keep-kube-proxy did not log %s", want)
		}
	}
	checkHandedBack(t, topo.Node, kubeChains)
	netns.WantPods(t, "after the hand-back", netns.DialMany(t, topo.Client, webVIP, 10), "pod-c")

	if again := runWeirOutput(t, topo.Node, weir, 0, args...); strings.Contains(again, "Removed") {
		t.Errorf("a second weir cleanup --keep-kube-proxy removed something:\n%s", again)
	}
	out = runWeirOutput(t, topo.Node, weir, 0, "cleanup", "--keep-kube-proxy", "--nftables-table", "kube-proxy", "--node-name", demoNode)
	if tables := nodeOutput(t, topo.Node, "nft", "list", "tables"); !strings.Contains(out, "nftables.table is kube-proxy's table name") ||
		!strings.Contains(tables, "table ip kube-proxy") {
		t.Errorf("with nftables.table kube-proxy, the hand-back touched kube-proxy's table:\n%s\n%s", out, tables)
	}
}

// checkHandedBack checks what the hand-back left: kube-proxy's tables and
// none of Weir's, and the iptables-legacy KUBE-* rules as they were.
func checkHandedBack(t *testing.T, node *netns.Namespace, kubeChains []string) {
	t.Helper()
	if tables := nodeOutput(t, node, "nft", "list", "tables"); tables != "table ip kube-proxy\ntable ip6 kube-proxy\n" {
		t.Errorf("nftables tables after the hand-back, want kube-proxy's and not Weir's:\n%s", tables)
	}
	if got := kubeLines(nodeOutput(t, node, "iptables-legacy-save")); strings.Join(got, "\n") != strings.Join(kubeChains, "\n") {
		t.Errorf("the hand-back changed the KUBE-* chains:\nbefore\n%s\nafter\n%s", strings.Join(kubeChains, "\n"), strings.Join(got, "\n"))
	}
}

// counters matches the packet counters of a saved chain declaration.
var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// kubeLines returns the chain declarations and rules of KUBE-* chains in
// an iptables-save listing, without counters.
func kubeLines(save string) []string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, ":KUBE-") || strings.HasPrefix(l, "-A KUBE-") || strings.Contains(l, "-j KUBE-") {
			out = append(out, counters.ReplaceAllString(l, ""))
		}
	}
	return out
}

// feed runs a command in ns with text on its standard input.
func feed(t *testing.T, ns *netns.Namespace, text, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := ns.Command(ctx, name, args...)
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestKernelNewestNATChainDecides checks the kernel fact both switches
// rely on (docs/operations.md): of two nftables tables whose NAT chains
// hook prerouting at the same priority, the chain created last runs first
// and its translation holds, so during a switch the proxy that started
// last decides where new connections go.
func TestKernelNewestNATChainDecides(t *testing.T) {
	topo := netns.NewThreePods(t)
	dnatTable := func(table string, to netip.Addr) {
		feed(t, topo.Node, fmt.Sprintf(`add table ip %[1]s
add chain ip %[1]s pre { type nat hook prerouting priority dstnat; }
add rule ip %[1]s pre ip daddr %[2]s tcp dport %[3]d dnat to %[4]s:%[5]d
`, table, webVIP.Addr(), webVIP.Port(), to, netns.PodPort), "nft", "-f", "-")
	}
	dnatTable("older", netns.PodA)
	dnatTable("newer", netns.PodB)
	netns.WantPods(t, "older, then newer", netns.DialMany(t, topo.Client, webVIP, 5), "pod-b")
	feed(t, topo.Node, "delete table ip older\n", "nft", "-f", "-")
	dnatTable("newest", netns.PodC)
	netns.WantPods(t, "newer, then newest", netns.DialMany(t, topo.Client, webVIP, 5), "pod-c")
}
