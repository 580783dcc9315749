package netns

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/kernelver"
)

// RequireRoot skips the test unless it runs as root, which creating network
// namespaces needs, on a kernel Weir supports (kernelver.Minimum or newer).
// With CI=true in the environment it fails instead, so CI cannot silently
// skip kernel tests; only -short, asked for explicitly, skips them always.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("kernel test: -short (make test-fast) leaves out the kernel")
	}
	msg := ""
	if os.Geteuid() != 0 {
		msg = "needs root: creates network namespaces"
	} else if err := kernelver.Supported(); err != nil {
		msg = "needs a supported kernel: " + err.Error()
	}
	if msg == "" {
		return
	}
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

// DialMany makes n TCP connections from ns to addr, one after another, each
// with a two-second limit, and fails the test on the first error.
func DialMany(t testing.TB, ns *Namespace, addr netip.AddrPort, n int) []Answer {
	t.Helper()
	answers := make([]Answer, 0, n)
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := ns.DialTCP(ctx, addr)
		cancel()
		if err != nil {
			t.Fatalf("dial %s from %s: %v", addr, ns.Name, err)
		}
		answers = append(answers, a)
	}
	return answers
}

// WantPods checks that exactly the named pods answered, each at least once.
func WantPods(t testing.TB, what string, answers []Answer, pods ...string) {
	t.Helper()
	tally := Tally(answers)
	for _, p := range pods {
		if tally[p] == 0 {
			t.Errorf("%s: %s never answered (tally %v)", what, p, tally)
		}
	}
	if len(tally) != len(pods) {
		t.Errorf("%s: answered by %v, want exactly %v", what, tally, pods)
	}
}
