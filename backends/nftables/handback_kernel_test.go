package nftables

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// handBackLogged is what HandBack logs after deleting both of Weir's
// tables.
const handBackLogged = `msg="Removed Weir's own rules" what="nftables tables" removed="ip weir, ip6 weir"`

// TestKernelHandBack hands a node back to kube-proxy's nftables mode, with
// real connections. Weir's tables serve web (pod-a) and other (pod-c);
// kube-proxy's tables, next to them and hooked first, serve web from
// pod-b. HandBack deletes both of Weir's tables and says so; kube-proxy's
// stay and keep serving web, while other, which only Weir's rules served,
// no longer answers. A second HandBack finds nothing to delete, and a
// backend configured with kube-proxy's table name leaves the tables alone.
func TestKernelHandBack(t *testing.T) {
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	topo, b := newCluster(t, Options{Common: backends.Common{Log: log}})
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1))
	other := svc("default", "other", "http", plan.TCP, "10.96.0.20", 80, 0, podEP(podC, 1))
	mustSync(t, b, testPlan(web, other), backends.FullSync())
	nftInput(t, b, kubeProxyLeftovers)
	webAddr, otherAddr := netip.AddrPortFrom(vip, 80), netip.MustParseAddrPort("10.96.0.20:80")
	netns.WantPods(t, "web, both tables there", netns.DialMany(t, topo.Client, webAddr, 3), "pod-b")
	netns.WantPods(t, "other, both tables there", netns.DialMany(t, topo.Client, otherAddr, 3), "pod-c")

	if err := b.HandBack(context.Background()); err != nil {
		t.Fatalf("HandBack: %v", err)
	}
	const kubeProxyTables = "table ip kube-proxy\ntable ip6 kube-proxy\n"
	if tables := nftOutput(t, b, "list", "tables"); tables != kubeProxyTables {
		t.Errorf("after HandBack the tables are:\n%s\nwant kube-proxy's only:\n%s", tables, kubeProxyTables)
	}
	if !strings.Contains(logs.String(), handBackLogged) {
		t.Errorf("HandBack did not log %s; log:\n%s", handBackLogged, logs)
	}
	netns.WantPods(t, "web after HandBack", netns.DialMany(t, topo.Client, webAddr, 3), "pod-b")
	wantDropped(t, "other after HandBack", topo.Client, otherAddr)

	if err := b.HandBack(context.Background()); err != nil {
		t.Errorf("HandBack without Weir's tables: %v", err)
	}
	if n := strings.Count(logs.String(), "Removed"); n != 1 {
		t.Errorf("a second HandBack logged a removal; log:\n%s", logs)
	}

	named, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), Log: log}, Table: kubeProxyTable})
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	if err := named.HandBack(context.Background()); err != nil {
		t.Errorf("HandBack with kube-proxy's table name: %v", err)
	}
	if tables := nftOutput(t, b, "list", "tables"); tables != kubeProxyTables || !strings.Contains(logs.String(), "nftables.table is kube-proxy's table name") {
		t.Errorf("with kube-proxy's table name HandBack touched the tables or did not say why not:\n%s\nlog:\n%s", tables, logs)
	}
}
