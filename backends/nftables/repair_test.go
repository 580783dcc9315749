package nftables

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Tampering: another process changes Weir's tables behind its back, as an
// operator with the nft tool (or a careless script) would. Every sync after
// it must succeed and bring traffic back.

// tampering is one way of breaking Weir's tables.
type tampering struct {
	name string
	// nft are commands for the nft tool, run in the node in order.
	nft []string
	// plant, when set, changes the tables over netlink instead.
	plant func(t *testing.T, fd int)
	// foreign is set when the tampering leaves objects Weir never writes
	// that block its own changes: only a rebuild from scratch removes
	// them, so the periodic full sync takes that path too.
	foreign bool
	// keepsAffinity is set when the affinity sets survive the tampering:
	// a periodic full sync then keeps every client on its endpoint.
	keepsAffinity bool
	// fullOnly is set when the tampering touches nothing a partial sync
	// changes (it changes elements only): such a sync succeeds and leaves
	// the tampering to the next periodic full sync.
	fullOnly bool
}

var tamperings = []tampering{
	{name: "flush ruleset", nft: []string{"flush ruleset"}},
	{name: "delete table", nft: []string{"delete table ip weir"}},
	{name: "delete endpoints map", keepsAffinity: true, nft: []string{
		"flush chain ip weir pick-ip-3", "flush chain ip weir pick-np-3", "delete map ip weir endpoints-3"}},
	{name: "delete pick chain", keepsAffinity: true, nft: []string{
		"delete element ip weir service-ips { 10.96.0.10 . tcp . 80 }", "delete chain ip weir pick-ip-3"}},
	{name: "delete elements", keepsAffinity: true, nft: []string{
		"delete element ip weir service-ips { 10.96.0.10 . tcp . 80 }",
		"delete element ip weir endpoints-3 { 10.96.0.10 . tcp . 80 . 1 }",
		"delete element ip weir service-nodeports { tcp . 30080 }"}},
	{name: "base chain policy drop", keepsAffinity: true, fullOnly: true, nft: []string{
		"add chain ip weir filter-forward { type filter hook forward priority -10; policy drop; }"}},
	{name: "foreign chain jumping to a pick chain", foreign: true, nft: []string{
		"add chain ip weir intruder", "add rule ip weir intruder jump pick-ip-3"}},
	{name: "foreign rule using an endpoints map", foreign: true, plant: plantEndpointsLookup},
	{name: "flush sticky chain", keepsAffinity: true, fullOnly: true, nft: []string{
		"flush chain ip weir sticky-ip-default/sticky/http/tcp"}},
	{name: "delete a cluster IP of the checks", keepsAffinity: true, fullOnly: true, nft: []string{
		"delete element ip weir cluster-ips { 10.96.0.10 }"}},
}

// plantEndpointsLookup adds a chain of its own to Weir's table with a rule
// that looks packets up in endpoints-3 (the nft tool cannot type that
// map's keys, so this goes over netlink; kernel 6.1 refuses a map used as a
// set, so the rule takes the map's data too).
func plantEndpointsLookup(t *testing.T, fd int) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: "weir", Family: nftables.TableFamilyIPv4}
	c := conn.AddChain(&nftables.Chain{Name: "intruder", Table: table})
	conn.AddRule(&nftables.Rule{Table: table, Chain: c, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey + 1},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey + 2},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey + 3},
		&expr.Lookup{SourceRegister: regKey, SetName: "endpoints-3", DestRegister: regKey + 4, IsDestRegSet: true},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if err := conn.Flush(); err != nil {
		t.Fatalf("plant a rule using endpoints-3: %v", err)
	}
}

// runNft runs the nft tool inside ns; it skips the test when nft is not
// installed (fails under CI=true).
func runNft(t *testing.T, ns *netns.Namespace, cmds ...string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs the nft tool to tamper with the tables (CI=true: must run)")
		}
		t.Skip("needs the nft tool to tamper with the tables")
	}
	for _, c := range cmds {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := ns.Command(ctx, "nft", c).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("nft %s: %v\n%s", c, err, out)
		}
	}
}

// rebuildLogged is the message Sync logs after rebuilding from scratch.
const rebuildLogged = "rebuilt Weir's tables from scratch"

// tamperPlan is the plan the tampering tests start from: web uses
// pick-ip-3, pick-np-3 and endpoints-3; sticky uses a sticky pick chain and
// endpoints-2.
func tamperPlan() (*plan.Plan, *plan.Service) {
	web := svc("default", "web", "http", plan.TCP, vip.String(), 80, 30080, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	sticky := svc("default", "sticky", "http", plan.TCP, "10.96.0.11", 80, 0, podEP(podA, 1), podEP(podB, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	return testPlan(web, sticky), web
}

func TestKernelRepairsTampering(t *testing.T) {
	for _, tm := range tamperings {
		t.Run(tm.name, func(t *testing.T) {
			t.Run("full sync", func(t *testing.T) { testRepair(t, tm, true) })
			if !tm.fullOnly {
				t.Run("partial sync", func(t *testing.T) { testRepair(t, tm, false) })
			}
		})
	}
}

// testRepair syncs, tampers, then syncs again (a periodic full sync, or a
// partial one changing web) and checks that the sync succeeded, whether it
// had to rebuild from scratch, and that connections reach the plan's
// endpoints again.
func testRepair(t *testing.T, tm tampering, full bool) {
	logs := &syncbuf.Buffer{}
	topo, b := newCluster(t, Options{Common: backends.Common{Log: slog.New(slog.NewTextHandler(logs, nil))}})
	p, web := tamperPlan()
	mustSync(t, b, p, backends.FullSync())
	webIP, nodePort := netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(topo.NodeIP, 30080)
	stickyIP := netip.MustParseAddrPort("10.96.0.11:80")
	netns.WantPods(t, "web before tampering", netns.DialMany(t, topo.Client, webIP, 30), "pod-a", "pod-b", "pod-c")
	stickyBefore := netns.DialMany(t, topo.Client, stickyIP, 1)[0].Pod

	runNft(t, topo.Node, tm.nft...)
	if tm.plant != nil {
		tm.plant(t, topo.Node.Fd())
	}

	want := []string{"pod-a", "pod-b", "pod-c"}
	req := backends.FullSync()
	if !full {
		smaller := web.Clone()
		smaller.Endpoints = smaller.Endpoints[:2]
		p.Services[web.Key] = smaller
		req, want = backends.PartialSync(web.Key), want[:2]
	}
	if err := b.Sync(context.Background(), p, req); err != nil {
		t.Fatalf("sync after tampering (%s): %v", tm.name, err)
	}
	nftLists(t, b)
	rebuilt := strings.Contains(logs.String(), rebuildLogged)
	if wantRebuild := tm.foreign || !full; rebuilt != wantRebuild {
		t.Errorf("rebuilt from scratch: %v, want %v; log:\n%s", rebuilt, wantRebuild, logs)
	}
	netns.WantPods(t, "web's cluster IP after the sync", netns.DialMany(t, topo.Client, webIP, 30), want...)
	netns.WantPods(t, "web's node port after the sync", netns.DialMany(t, topo.Client, nodePort, 30), want...)
	first := netns.DialMany(t, topo.Client, stickyIP, 1)[0].Pod
	netns.WantPods(t, "sticky after the sync", netns.DialMany(t, topo.Client, stickyIP, 10), first)
	if full && tm.keepsAffinity && first != stickyBefore {
		t.Errorf("sticky's client moved from %s to %s: the refill lost ClientIP affinity", stickyBefore, first)
	}

	// The next partial sync works on what the repair left.
	again := p.Services[web.Key].Clone()
	again.Endpoints = []plan.Endpoint{podEP(podC, 1)}
	p.Services[web.Key] = again
	mustSync(t, b, p, backends.PartialSync(web.Key))
	netns.WantPods(t, "web after one more partial sync", netns.DialMany(t, topo.Client, webIP, 5), "pod-c")
}
