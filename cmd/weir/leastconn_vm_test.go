//go:build vm

package main

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/weirproxy/weir/test/netns"
)

// leastConnWasmEnv names the least-conn plugin's file in the VM; make
// test-vm builds it and copies it in. Not WEIR_*: those are Weir's own.
const leastConnWasmEnv = "GO_TEST_LEAST_CONN_WASM"

// TestVMIPVSLeastConn is TestKernelLeastConn in mode ipvs, whose signals
// are IPVS's own per-real-server counts: connections held open to pod-a
// through the virtual server move new connections to pod-b and pod-c. The
// scheduler is wrr: rr, IPVS's default, ignores weights.
func TestVMIPVSLeastConn(t *testing.T) {
	netns.RequireRoot(t)
	if !ipvsInKernel() {
		t.Fatalf("no %s: the VM must load ip_vs", procIPVS)
	}
	plugin := os.Getenv(leastConnWasmEnv)
	if plugin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: make test-vm passes the least-conn plugin's file", leastConnWasmEnv)
		}
		t.Skipf("%s is not set (make test-vm sets it)", leastConnWasmEnv)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	leastConn(t, self, plugin, []string{"--mode", "ipvs", "--ipvs-scheduler", "wrr"}, startInVM)
}

// startInVM starts this test binary as weir inside ns, from a thread
// there (the VM has no `ip netns exec`).
func startInVM(t *testing.T, ns *netns.Namespace, self string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(weirEnv(), runAsWeir+"=1")
	return superviseDaemon(t, cmd, cancel, func() error { return ns.Do(cmd.Start) }, args)
}
