package netns

import (
	"os"
	"testing"
)

// RequireRoot skips the test unless it runs as root, which creating network
// namespaces needs. With CI=true in the environment it fails instead, so CI
// cannot silently skip kernel tests.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const msg = "needs root: creates network namespaces"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: kernel tests must run)")
	}
	t.Skip(msg)
}

// NewT builds a topology for a test and closes it when the test ends; it
// skips or fails like RequireRoot when not root.
func NewT(t testing.TB, opts Options) *Topology {
	t.Helper()
	RequireRoot(t)
	topo, err := New(opts)
	if err != nil {
		t.Fatalf("netns topology: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("close netns topology: %v", err)
		}
	})
	return topo
}
