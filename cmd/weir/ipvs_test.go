package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends/ipvs"
	"github.com/weirproxy/weir/core/config"
	"github.com/weirproxy/weir/test/netns"
)

// TestIPVSConfigMatchesBackend keeps core/config's copy of the scheduler
// names, and its ipvs defaults, equal to the backend's.
func TestIPVSConfigMatchesBackend(t *testing.T) {
	if !slices.Equal(config.IPVSSchedulers, ipvs.Schedulers) {
		t.Errorf("config.IPVSSchedulers = %v, ipvs.Schedulers = %v", config.IPVSSchedulers, ipvs.Schedulers)
	}
	c := config.Default().IPVS
	if c.Scheduler != ipvs.DefaultScheduler || c.Interface != ipvs.DefaultInterface || c.GracePeriod != ipvs.DefaultGracePeriod {
		t.Errorf("config defaults %+v, backend defaults scheduler %s, interface %s, grace period %s",
			c, ipvs.DefaultScheduler, ipvs.DefaultInterface, ipvs.DefaultGracePeriod)
	}
}

// TestKernelNoIPVS runs weir on a kernel without IPVS, like this host's:
// cleanup in the default mode skips mode ipvs and succeeds; mode ipvs
// fails at once with an error that says why.
func TestKernelNoIPVS(t *testing.T) {
	netns.RequireRoot(t)
	if ipvsInKernel() {
		t.Skip("this kernel has IPVS (" + procIPVS + " exists)")
	}
	weir := buildWeir(t)
	topo := netns.NewT(t, netns.Options{})

	out := runWeirOutput(t, topo.Node, weir, 0, "cleanup", "--node-name", demoNode)
	for _, want := range []string{"Skipping mode ipvs", `msg="Removed Weir's rules" mode=nftables`} {
		if !strings.Contains(out, want) {
			t.Errorf("weir cleanup did not log %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"level=WARN", "level=ERROR", "level=error", "modprobe"} {
		if strings.Contains(out, bad) {
			t.Errorf("weir cleanup logged %q:\n%s", bad, out)
		}
	}

	for _, args := range [][]string{
		{"cleanup", "--mode", "ipvs"},
		{"sync", "--once", "--mode", "ipvs", "--source-path", t.TempDir()},
	} {
		out := runWeirOutput(t, topo.Node, weir, exitFailed, append(args, "--node-name", demoNode)...)
		if want := "this kernel has no IPVS (no /proc/net/ip_vs)"; !strings.Contains(out, want) {
			t.Errorf("weir %s did not say %q:\n%s", strings.Join(args, " "), want, out)
		}
		if n := strings.Count(out, "this kernel has no IPVS"); n != 1 {
			t.Errorf("weir %s reported the missing IPVS %d times, want once:\n%s", strings.Join(args, " "), n, out)
		}
	}
}

// runWeirOutput runs weir to completion in ns, fails the test unless it
// exits with code, and returns its output.
func runWeirOutput(t *testing.T, ns *netns.Namespace, weir string, code int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, weir, args...)
	cmd.Env = weirEnv()
	out, _ := cmd.CombinedOutput()
	if got := cmd.ProcessState.ExitCode(); got != code {
		t.Fatalf("weir %s: exit %d, want %d\n%s", strings.Join(args, " "), got, code, out)
	}
	t.Logf("weir %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}
