package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// holdLock takes the xtables lock file as another iptables writer would
// (an flock) and returns its release.
func holdLock(t *testing.T, file string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { f.Close() }
}

// timedSync runs one sync and returns its duration and error.
func timedSync(b *Backend, p *plan.Plan, req backends.SyncRequest) (time.Duration, error) {
	start := time.Now()
	err := b.Sync(context.Background(), p, req)
	return time.Since(start), err
}

// wantLockError checks that err is a lock timeout naming file and this
// process, returned after about xtables.LockWait.
func wantLockError(t *testing.T, what string, err error, took time.Duration, file string) {
	t.Helper()
	var lerr *xtables.LockError
	if !errors.As(err, &lerr) {
		t.Fatalf("%s with the lock held: %v, want an xtables lock timeout", what, err)
	}
	for _, want := range []string{file, fmt.Sprintf("pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not name %s", what, err, want)
		}
	}
	if took < xtables.LockWait-500*time.Millisecond || took >= 2*xtables.LockWait {
		t.Errorf("%s failed after %s, want one bounded wait of %s", what, took, xtables.LockWait)
	}
}

// TestKernelXtablesLock holds the xtables lock while the backend syncs.
// The lock is one for the whole machine, so the test and the tools it
// runs use a lock file of their own (XTABLES_LOCKFILE); the flavours run
// one after the other. With iptables-legacy, a first sync and a partial
// sync each fail after one bounded wait with an error naming the lock and
// its holder, the rules in place keep serving, and once the lock is
// released the next sync succeeds. iptables-nft takes no lock: a sync
// succeeds while it is held.
func TestKernelXtablesLock(t *testing.T) {
	netns.RequireRoot(t)
	file := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", file)
	web := ktService("web", ktVIP, ktPodA)
	addr := netip.AddrPortFrom(ktVIP, 80)
	t.Run(flavourLegacy, func(t *testing.T) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, flavourLegacy)
		release := holdLock(t, file)
		took, err := timedSync(b, ktPlan(web), backends.FullSync())
		wantLockError(t, "first sync", err, took, file)
		release()
		ktSync(t, b, ktPlan(web), backends.FullSync())
		netns.WantPods(t, "after the lock was released", netns.DialMany(t, topo.Client, addr, 3), "pod-a")

		release = holdLock(t, file)
		moved := ktService("web", ktVIP, ktPodB)
		took, err = timedSync(b, ktPlan(moved), backends.PartialSync(web.Key))
		wantLockError(t, "partial sync", err, took, file)
		netns.WantPods(t, "while the lock is held", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
		release()
		ktSync(t, b, ktPlan(moved), backends.PartialSync(web.Key))
		netns.WantPods(t, "after the retry", netns.DialMany(t, topo.Client, addr, 3), "pod-b")
	})
	t.Run(flavourNFT, func(t *testing.T) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, flavourNFT)
		// Were the lock taken, the sync would fail after the bounded wait.
		defer holdLock(t, file)()
		if err := b.Sync(context.Background(), ktPlan(web), backends.FullSync()); err != nil {
			t.Fatalf("iptables-nft sync with the lock held: %v, want success: iptables-nft takes no lock", err)
		}
		netns.WantPods(t, "iptables-nft with the lock held", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
	})
}
