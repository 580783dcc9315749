//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/compare"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// TestCompareHarness runs `make bench-compare`'s harness (test/compare)
// at a tiny size, kube-proxy and Weir in mode nftables with a 5 s churn,
// and fails when the harness breaks: a run that fails, passes its cap or
// lacks a measure, or a table without both proxies and their ratios. It
// judges no figure.
func TestCompareHarness(t *testing.T) {
	netns.RequireRoot(t)
	bins := controlplane.RequireBinaries(t)
	weir := weirBinary(t)
	cp := controlplane.Start(t)
	cfg := compare.Defaults()
	cfg.Weir, cfg.KubeProxy = weir, bins.KubeProxy
	cfg.Sizes, cfg.ZeroSizes = []compare.Size{{Services: 200, Endpoints: 10}}, nil
	cfg.Modes = []string{"nftables"}
	cfg.Changes, cfg.ChurnDuration, cfg.ProbeServices = 3, 5*time.Second, 10
	cfg.Cap = 90 * time.Second
	cfg.Dir = t.TempDir()
	var progress bytes.Buffer
	cfg.Log = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := compare.Run(ctx, cp, cfg)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("compare.Run: %v", err)
	}
	compareCheck(t, rep, cfg)
	t.Logf("table:\n%s", rep.Markdown("", cfg.Cap))
}

// compareCheck fails t unless rep holds both proxies' complete results
// and a table with a ratio row.
func compareCheck(t *testing.T, rep *compare.Report, cfg compare.Config) {
	t.Helper()
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want kube-proxy's and Weir's", len(rep.Results))
	}
	for _, r := range rep.Results {
		switch {
		case r.Failed != "" || r.Capped != "" || r.Skipped != "":
			t.Errorf("%s: failed %q, capped %q, skipped %q (logs in %s)", r.Target, r.Failed, r.Capped, r.Skipped, r.Dir)
		case len(r.Missing()) > 0:
			t.Errorf("%s: measures missing: %s (logs in %s)", r.Target, strings.Join(r.Missing(), ", "), r.Dir)
		case len(r.Changes) != cfg.Changes:
			t.Errorf("%s: %d changes timed, want %d", r.Target, len(r.Changes), cfg.Changes)
		case r.ChurnWrites+r.ChurnLate != int(cfg.ChurnRate*cfg.ChurnDuration.Seconds()):
			t.Errorf("%s: churn wrote %d times and left out %d, want %g in all", r.Target, r.ChurnWrites, r.ChurnLate,
				cfg.ChurnRate*cfg.ChurnDuration.Seconds())
		}
	}
	if len(rep.Loads) != 1 || rep.Loads[0].Writes < 2*cfg.Sizes[0].Services {
		t.Errorf("loads %+v: want one of at least %d writes", rep.Loads, 2*cfg.Sizes[0].Services)
	}
	md := rep.Markdown("header", cfg.Cap)
	for _, want := range []string{"| 200 × 10 | 1s | nftables | kube-proxy |", "| Weir |", "| Weir / kube-proxy |"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
