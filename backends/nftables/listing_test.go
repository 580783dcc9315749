package nftables

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/nsenter"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// nftLists checks that the nft tool lists what the backend committed: `nft
// list ruleset`, its JSON form and its terse form each succeed in the
// backend's namespace. An operator's first look at a node is one of them;
// nft 1.0.6 aborted on a rule whose lookup key held another lookup's result
// and on concatenations of its sizeless integer type. It skips outside CI
// when the nft tool is missing.
func nftLists(t testing.TB, b *Backend) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs the nft tool to list the tables (CI=true: must run)")
		}
		t.Skip("needs the nft tool to list the tables")
	}
	for _, args := range [][]string{{"list", "ruleset"}, {"-j", "list", "ruleset"}, {"-t", "list", "ruleset"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var stderr strings.Builder
		var out []byte
		// A child forked on a thread inside the namespace starts there.
		err := nsenter.Do(b.opts.NetNS, func() (err error) {
			cmd := exec.CommandContext(ctx, "nft", args...)
			cmd.Stderr = &stderr
			out, err = cmd.Output()
			return err
		})
		cancel()
		switch {
		case err != nil:
			t.Errorf("nft %s fails after a sync: %v\n%s", strings.Join(args, " "), err, stderr.String())
		case args[0] == "-j" && !json.Valid(out):
			t.Errorf("nft -j list ruleset prints no valid JSON after a sync:\n%.2000s", out)
		case !strings.Contains(string(out), "weir"):
			t.Errorf("nft %s does not show Weir's tables after a sync:\n%.2000s", strings.Join(args, " "), out)
		}
	}
}

// TestKernelNftPrints commits plans that use every kind of set, map and
// rule of the layout (weights, UDP, refusals, Local policies and their
// short circuit, external and load-balancer IPs with source ranges,
// ClientIP affinity, both families, localhost node ports) and compares what
// `nft list ruleset` prints with golden files: what an operator reads.
func TestKernelNftPrints(t *testing.T) {
	sticky := svc("default", "sticky", "http", plan.TCP, "10.96.0.40", 80, 30090,
		ep("10.244.0.11", 8080, 2), ep("10.244.0.12", 8080, 1), ep("10.244.0.13", 8080, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 10800}
	cases := []struct {
		name string
		opts backends.Common
		plan *plan.Plan
	}{
		{"full", backends.Common{ClusterCIDRs: goldenCIDRs[:1]}, fullPlan()},
		{"dual-stack-sticky", backends.Common{ClusterCIDRs: goldenCIDRs, LocalhostNodePorts: true},
			testPlan(dualStackSticky(), sticky, etpLocal(withExternalIPs(svc("default", "edge", "http", plan.TCP, "10.96.0.30", 80, 30082,
				ep("10.244.0.11", 8080, 1), ep("10.244.1.11", 8080, 1)), "192.0.2.30"), "10.244.0.11"))},
		{"node-cidr", backends.Common{LocalDetector: backends.DetectNodeCIDR, NodePortPrimary: true},
			&plan.Plan{Services: fullPlan().Services, Node: plan.Node{PodCIDRs: goldenCIDRs[:1],
				Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			topo := netns.NewT(t, netns.Options{})
			c.opts.NetNS = topo.Node.Fd()
			b, err := New(Options{Common: c.opts})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			mustSync(t, b, c.plan, backends.FullSync())
			listing := nftOutput(t, b, "list", "ruleset")
			if _, err := os.Stat("testdata"); err != nil {
				// The binary runs without its sources, as in the VM; the
				// host's run compares.
				t.Logf("no testdata here: the listing was not compared")
				return
			}
			if v := strings.TrimSpace(nftOutput(t, b, "--version")); !strings.HasPrefix(v, goldenNft) {
				t.Logf("nft is %q, not %s, which printed the golden files: the listing was not compared", v, goldenNft)
				return
			}
			golden(t, c.name+".list", listing)
		})
	}
}

// goldenNft is the nft release whose listings the *.list golden files hold
// (Debian 12's); other releases format some things differently.
const goldenNft = "nftables v1.0.6 "

// nftOutput runs the nft tool in the backend's namespace and returns what
// it prints.
func nftOutput(t *testing.T, b *Backend, args ...string) string {
	t.Helper()
	var out []byte
	err := nsenter.Do(b.opts.NetNS, func() (err error) {
		out, err = exec.Command("nft", args...).Output()
		return err
	})
	if err != nil {
		t.Fatalf("nft %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
