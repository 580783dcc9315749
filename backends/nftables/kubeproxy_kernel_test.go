package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/nsenter"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// kubeProxyLeftovers is what a stopped kube-proxy in nftables mode leaves:
// its tables, with a stale rule sending the service to pod-b, hooked
// before Weir's.
const kubeProxyLeftovers = `
add table ip kube-proxy
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat - 10; }
add rule ip kube-proxy nat-prerouting ip daddr 10.96.0.10 tcp dport 80 dnat to 10.244.0.12:8080
add table ip6 kube-proxy
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority dstnat - 10; }
`

// TestKernelRemovesKubeProxyTables proves the takeover in nftables mode with
// real connections: while kube-proxy's stale table is there it wins over
// Weir's rules; RemoveKubeProxy deletes both of kube-proxy's tables, keeps
// Weir's serving and its generation stamp trusted (no refill for a commit
// of Weir's own); Cleanup removes kube-proxy's tables too.
func TestKernelRemovesKubeProxyTables(t *testing.T) {
	topo, b := newCluster(t, Options{})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())
	addr := netip.AddrPortFrom(vip, 80)
	nftInput(t, b, kubeProxyLeftovers)
	netns.WantPods(t, "with kube-proxy's table", netns.DialMany(t, topo.Client, addr, 3), "pod-b")

	mustSync(t, b, p, backends.FullSync()) // a refill: the stamp trusts the kernel again
	if err := b.RemoveKubeProxy(context.Background()); err != nil {
		t.Fatalf("RemoveKubeProxy: %v", err)
	}
	if tables := nftOutput(t, b, "list", "tables"); strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "ip weir") {
		t.Errorf("after RemoveKubeProxy the tables are:\n%s\nwant Weir's and none of kube-proxy's", tables)
	}
	netns.WantPods(t, "after RemoveKubeProxy", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
	if !b.untouched() {
		t.Error("removing kube-proxy's tables left Weir's generation stamp untrusted: the next periodic sync refills")
	}
	if err := b.RemoveKubeProxy(context.Background()); err != nil {
		t.Errorf("RemoveKubeProxy without kube-proxy's tables: %v", err)
	}

	nftInput(t, b, kubeProxyLeftovers)
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if tables := nftOutput(t, b, "list", "tables"); strings.TrimSpace(tables) != "" {
		t.Errorf("after Cleanup the tables are:\n%s\nwant none", tables)
	}
}

// nftInput feeds text to `nft -f -` in the backend's namespace.
func nftInput(t *testing.T, b *Backend, text string) {
	t.Helper()
	err := nsenter.Do(b.opts.NetNS, func() error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(text)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("nft -f: %v", err)
	}
}
