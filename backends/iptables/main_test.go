package iptables

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestMain gives this test binary an xtables lock file of its own (unless
// XTABLES_LOCKFILE is set already). Every kernel test works in network
// namespaces of its own, whose tables no other process touches, but the
// lock is one for the whole machine: without this, another process's long
// restore (a 10k-service benchmark, a soak) would make the tests' legacy
// restores give up after xtables.LockWait. The tests still queue on this
// file among themselves.
func TestMain(m *testing.M) {
	if os.Getenv("XTABLES_LOCKFILE") == "" {
		dir, err := os.MkdirTemp("", "weir-iptables-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Setenv("XTABLES_LOCKFILE", filepath.Join(dir, "xtables.lock"))
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}
