package iptables

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/netns"
)

// canaryTables are the tables kube-proxy's iptables mode keeps its canary
// in.
var canaryTables = []string{"mangle", "nat", "filter"}

// canaryState is what a stopped kube-proxy in iptables mode leaves in
// table of either family, its empty canary, next to kubelet's canary and
// a chain of another program with a rule, which must stay.
func canaryState(table string) string {
	return "*" + table + "\n:" + kubeProxyCanary + " - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:OTHER-PROGRAM - [0:0]\n-A OTHER-PROGRAM -j RETURN\nCOMMIT\n"
}

// TestKernelRemovesKubeProxyCanaries proves, in each flavour, that the
// takeover and the cleanup delete kube-proxy's canary chains from the
// mangle, nat and filter tables of both families: after Weir's first sync
// RemoveKubeProxy deletes them while Weir's rules keep serving, and,
// planted again, Cleanup deletes them too. Kubelet's canary and another
// program's chain stay every time.
func TestKernelRemovesKubeProxyCanaries(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		tools, err := lookupFlavour(fl)
		if err != nil {
			t.Fatal(err)
		}
		plantCanaries(t, topo, tools)
		b := ktBackend(t, topo, fl)
		ktSync(t, b, ktPlan(ktService("web", ktVIP, ktPodA)), backends.FullSync())
		if err := b.RemoveKubeProxy(context.Background()); err != nil {
			t.Fatalf("RemoveKubeProxy: %v", err)
		}
		wantNoCanary(t, topo, tools, "after RemoveKubeProxy")
		netns.WantPods(t, "after RemoveKubeProxy", netns.DialMany(t, topo.Client, netip.AddrPortFrom(ktVIP, 80), 5), "pod-a")

		plantCanaries(t, topo, tools)
		if err := b.Cleanup(context.Background()); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		wantNoCanary(t, topo, tools, "after Cleanup")
	})
}

// plantCanaries writes canaryState into mangle, nat and filter of both
// families.
func plantCanaries(t *testing.T, topo *netns.Topology, fl *flavour) {
	t.Helper()
	for _, f := range []ipFamily{ipv4, ipv6} {
		for _, table := range canaryTables {
			ktRestore(t, topo, fl, f, canaryState(table))
		}
	}
}

// wantNoCanary checks that no table of either family has kube-proxy's
// canary, and that every one still has kubelet's canary and the other
// program's chain with its rule.
func wantNoCanary(t *testing.T, topo *netns.Topology, fl *flavour, what string) {
	t.Helper()
	for _, f := range []ipFamily{ipv4, ipv6} {
		for _, table := range canaryTables {
			save := ktSave(t, topo, fl, f, table)
			if strings.Contains(save, ":"+kubeProxyCanary+" ") {
				t.Errorf("%s: IPv%d %s still has %s:\n%s", what, f, table, kubeProxyCanary, save)
			}
			if !strings.Contains(save, ":KUBE-KUBELET-CANARY ") || !strings.Contains(save, "-A OTHER-PROGRAM -j RETURN") {
				t.Errorf("%s: IPv%d %s lost a chain that is not kube-proxy's:\n%s", what, f, table, save)
			}
		}
	}
}

// TestKernelCleanupCreatesNoLegacyTable cleans up with iptables-legacy,
// and takes over, in a namespace where no legacy table exists: none may
// appear. A legacy tool asked only to read a table creates it, and on a
// node using iptables-nft every iptables run would then warn of legacy
// tables.
func TestKernelCleanupCreatesNoLegacyTable(t *testing.T) {
	topo := netns.NewT(t, netns.Options{})
	b := ktBackend(t, topo, flavourLegacy)
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := b.RemoveKubeProxy(context.Background()); err != nil {
		t.Fatalf("RemoveKubeProxy: %v", err)
	}
	if err := b.HandBack(context.Background()); err != nil {
		t.Fatalf("HandBack: %v", err)
	}
	for _, names := range legacyTableNames {
		var got []byte
		err := topo.Node.Do(func() (err error) {
			got, err = os.ReadFile("/proc/thread-self/net/" + names)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			t.Errorf("after Cleanup, RemoveKubeProxy and HandBack the namespace has legacy tables (%s): %s", names, got)
		}
	}
}
