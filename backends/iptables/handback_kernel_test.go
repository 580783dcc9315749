package iptables

import (
	"context"
	"log/slog"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelHandBackLeavesChains hands a node back to kube-proxy's
// iptables mode, in each flavour: after Weir's sync, HandBack changes
// nothing in the kernel (kube-proxy's first sync takes Weir's chains
// over, as they carry its names), says it left the chains to kube-proxy,
// and Weir's rules still serve. A backend of the other flavour, which
// holds none of Weir's chains, says nothing.
func TestKernelHandBackLeavesChains(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		tools, err := lookupFlavour(fl)
		if err != nil {
			t.Fatal(err)
		}
		logs := &syncbuf.Buffer{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), Log: log}, Flavour: fl})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ktSync(t, b, ktPlan(ktService("web", ktVIP, ktPodA)), backends.FullSync())
		before := handBackSaves(t, topo, tools)
		if err := b.HandBack(context.Background()); err != nil {
			t.Fatalf("HandBack: %v", err)
		}
		if after := handBackSaves(t, topo, tools); after != before {
			t.Errorf("HandBack changed the tables:\nbefore\n%s\nafter\n%s", before, after)
		}
		if want := `msg="Left the iptables chains to kube-proxy: Weir's carry kube-proxy's names, and its iptables mode took them over on its first sync" flavour=` + fl; !strings.Contains(logs.String(), want) {
			t.Errorf("HandBack did not log %s; log:\n%s", want, logs)
		}
		netns.WantPods(t, "after HandBack", netns.DialMany(t, topo.Client, netip.AddrPortFrom(ktVIP, 80), 5), "pod-a")

		other := map[string]string{flavourLegacy: flavourNFT, flavourNFT: flavourLegacy}[fl]
		ob, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), Log: log}, Flavour: other})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		if err := ob.HandBack(context.Background()); err != nil {
			t.Errorf("HandBack in flavour %s: %v", other, err)
		}
		if n := strings.Count(logs.String(), "Left the iptables chains"); n != 1 {
			t.Errorf("HandBack in flavour %s, which holds none of Weir's chains, said it left some; log:\n%s", other, logs)
		}
	})
}

// counters matches the packet counters iptables-save prints.
var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// handBackSaves returns the nat and filter tables of both families,
// without counters or comment lines.
func handBackSaves(t *testing.T, topo *netns.Topology, fl *flavour) string {
	t.Helper()
	var out strings.Builder
	for _, f := range []ipFamily{ipv4, ipv6} {
		for _, table := range []string{tableNAT, tableFilter} {
			for line := range strings.Lines(ktSave(t, topo, fl, f, table)) {
				if !strings.HasPrefix(line, "#") {
					out.WriteString(counters.ReplaceAllString(line, ""))
				}
			}
		}
	}
	return out.String()
}
