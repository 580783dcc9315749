package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/netns"
)

// kubeProxyIPVSState is what kube-proxy's IPVS mode leaves in iptables that
// Weir's layout has no chain for, with a stale filter rule (reached here
// from FORWARD) that drops what is forwarded to pod-a.
const kubeProxyIPVSState = `*filter
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
-A FORWARD -j KUBE-IPVS-FILTER
-A KUBE-IPVS-FILTER -d 10.244.0.11/32 -j DROP
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
COMMIT
*nat
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-NODE-PORT -p tcp --dport 30080 -j KUBE-MARK-MASQ
COMMIT
`

// TestKernelRemovesKubeProxyIPVSChains proves the takeover of iptables
// left by kube-proxy's IPVS mode, in each flavour, with real connections:
// after Weir's first sync RemoveKubeProxy deletes the chains Weir's layout
// does not have and the rules jumping into them, so the stale filter stops
// dropping; Weir's rules keep serving, its look at the tables (confused by
// kube-proxy's jumps into KUBE-MARK-MASQ) is trusted again, and Cleanup
// removes such chains too.
func TestKernelRemovesKubeProxyIPVSChains(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		tools, err := lookupFlavour(fl)
		if err != nil {
			t.Fatal(err)
		}
		ktRestore(t, topo, tools, ipv4, kubeProxyIPVSState)
		b := ktBackend(t, topo, fl)
		p := ktPlan(ktService("web", ktVIP, ktPodA, ktPodB))
		ktSync(t, b, p, backends.FullSync())
		if err := b.RemoveKubeProxy(context.Background()); err != nil {
			t.Fatalf("RemoveKubeProxy: %v", err)
		}
		addr := netip.AddrPortFrom(ktVIP, 80)
		netns.WantPods(t, "after RemoveKubeProxy", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-b")
		wantNoKubeProxyIPVSChains(t, topo, tools, "after RemoveKubeProxy")
		if b.lookBroken.Load() {
			t.Error("after RemoveKubeProxy Weir still does not trust its look at the tables")
		}
		if save := ktSave(t, topo, tools, ipv4, tableNAT); !strings.Contains(save, "-j KUBE-SERVICES") {
			t.Errorf("RemoveKubeProxy removed Weir's jumps:\n%s", save)
		}
		if err := b.RemoveKubeProxy(context.Background()); err != nil {
			t.Errorf("RemoveKubeProxy with nothing left: %v", err)
		}
		ktSync(t, b, p, backends.FullSync())
		netns.WantPods(t, "after a full sync", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-b")

		ktRestore(t, topo, tools, ipv4, kubeProxyIPVSState)
		if err := b.Cleanup(context.Background()); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		wantNoKubeProxyIPVSChains(t, topo, tools, "after Cleanup")
	})
}

// wantNoKubeProxyIPVSChains checks that no chain of kubeProxyIPVSChains,
// and no rule jumping into one, is left in the IPv4 tables.
func wantNoKubeProxyIPVSChains(t *testing.T, topo *netns.Topology, fl *flavour, what string) {
	t.Helper()
	for table, chains := range kubeProxyIPVSChains {
		save := ktSave(t, topo, fl, ipv4, table)
		for _, c := range chains {
			if strings.Contains(save, ":"+c+" ") || strings.Contains(save, "-j "+c+"\n") {
				t.Errorf("%s: %s chain %s or a jump into it is left:\n%s", what, table, c, save)
			}
		}
	}
}
