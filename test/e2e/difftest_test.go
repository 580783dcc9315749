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

// difftestSeeds are the seeds TestDifferential runs in each mode, a few
// of the twenty make difftest runs; WEIRTEST_DIFFTEST_SEEDS (comma
// separated) picks others.
var difftestSeeds = []int64{1, 2}

// TestDifferential runs `make difftest`'s differential test (test/difftest)
// for a few seeds in modes nftables and iptables: each seed's generated
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
	for _, seed := range seedsFromEnv(t) {
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
		results, err := difftest.RunSeed(ctx, cp, cfg, seed, difftest.Modes)
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

func seedsFromEnv(t *testing.T) []int64 {
	env := os.Getenv("WEIRTEST_DIFFTEST_SEEDS")
	if env == "" {
		return difftestSeeds
	}
	var out []int64
	for _, f := range strings.Split(env, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("WEIRTEST_DIFFTEST_SEEDS: %q is not a seed", f)
		}
		out = append(out, n)
	}
	return out
}
