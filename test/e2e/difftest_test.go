//go:build e2e

package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/difftest"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// difftestSeeds are the seeds TestDifferential runs, one per mode, a few
// of the twenty make difftest runs in each; WEIRTEST_DIFFTEST_SEEDS (comma
// separated) picks others, each then run in both modes.
var difftestSeeds = map[string][]int64{"nftables": {1}, "iptables": {2}}

// TestDifferential runs `make difftest`'s differential test (test/difftest)
// for a seed in mode nftables and another in mode iptables: each seed's generated
// Services and EndpointSlices written through the real control plane,
// served by the real kube-proxy v1.37, by Weir and by kube-proxy again,
// every probe compared. It fails on any probe where Weir disagrees with
// kube-proxy (no deliberate difference explaining it) or kube-proxy with
// itself, printing the probes, both outcomes and the objects.
func TestDifferential(t *testing.T) {
	netns.RequireRoot(t)
	bins := controlplane.RequireBinaries(t)
	cfg := difftest.Config{Weir: weirBinary(t), KubeProxy: bins.KubeProxy, Dir: t.TempDir(), Logf: t.Logf}
	cp := controlplane.Start(t)
	for _, run := range seedsFromEnv(t) {
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
		results, err := difftest.RunSeed(ctx, cp, cfg, run.seed, run.modes)
		cancel()
		for _, r := range results {
			if r.Agrees() {
				t.Log(r.Summary())
			} else {
				t.Errorf("%s", r.Report())
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// seedRun is a seed and the modes it runs in.
type seedRun struct {
	seed  int64
	modes []string
}

func seedsFromEnv(t *testing.T) []seedRun {
	env := os.Getenv("WEIRTEST_DIFFTEST_SEEDS")
	if env == "" {
		var out []seedRun
		for _, mode := range difftest.Modes {
			for _, seed := range difftestSeeds[mode] {
				out = append(out, seedRun{seed, []string{mode}})
			}
		}
		return out
	}
	var out []seedRun
	for _, f := range strings.Split(env, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("WEIRTEST_DIFFTEST_SEEDS: %q is not a seed", f)
		}
		out = append(out, seedRun{n, difftest.Modes})
	}
	return out
}
