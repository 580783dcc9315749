package xtables

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestWaitArgs(t *testing.T) {
	if got := strings.Join(WaitArgs(), " "); got != "--wait 5" {
		t.Errorf("WaitArgs = %q, want kube-proxy's bound, --wait 5", got)
	}
}

func TestFlockHolder(t *testing.T) {
	locks := `1: POSIX  ADVISORY  WRITE 811 00:19:1234 0 EOF
2: FLOCK  ADVISORY  WRITE 28523 fe:00:9977864 0 EOF
2: -> FLOCK  ADVISORY  WRITE 28600 fe:00:9977864 0 EOF
3: FLOCK  ADVISORY  WRITE 77 fe:01:9977864 0 EOF
`
	if pid := flockHolder([]byte(locks), 0xfe, 0, 9977864); pid != 28523 {
		t.Errorf("flockHolder = %d, want 28523 (not the waiter 28600, not the other device's 77)", pid)
	}
	if pid := flockHolder([]byte(locks), 0x00, 0x19, 1234); pid != 0 {
		t.Errorf("flockHolder of a POSIX lock = %d, want 0: iptables takes an flock", pid)
	}
}

// exitWith returns the error of a process that exited with code.
func exitWith(t *testing.T, code int) error {
	t.Helper()
	err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run()
	if err == nil {
		t.Fatal("sh exited 0")
	}
	return err
}

// TestCheckLock holds an flock on a lock file of its own (XTABLES_LOCKFILE,
// which the tools honour too) and checks that a tool's lock timeout
// becomes a LockError naming the file and this process as the holder, and
// that other failures do not.
func TestCheckLock(t *testing.T) {
	file := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", file)
	if LockFile() != file {
		t.Fatalf("LockFile = %s, want $XTABLES_LOCKFILE %s", LockFile(), file)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	stderr := []byte("Another app is currently holding the xtables lock. Stopped waiting after 5s.\n")
	err = CheckLock("/usr/sbin/iptables-legacy-restore", stderr, exitWith(t, 4))
	var lerr *LockError
	if !errors.As(err, &lerr) {
		t.Fatalf("CheckLock of a lock timeout = %v, want a *LockError", err)
	}
	self := fmt.Sprintf("pid %d (", os.Getpid())
	for _, want := range []string{"iptables-legacy-restore", file, self, "5s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if err := CheckLock("iptables", []byte("iptables: No chain/target/match by that name.\n"), exitWith(t, 1)); err != nil {
		t.Errorf("CheckLock of another failure = %v, want nil", err)
	}
	if err := CheckLock("iptables", stderr, nil); err != nil {
		t.Errorf("CheckLock of a success = %v, want nil", err)
	}
	// go-iptables puts the tool's complaint in its error text.
	wrapped := fmt.Errorf("running [iptables -C ...]: exit status 4: %s: %w", stderr, exitWith(t, 4))
	if err := CheckLock("iptables", nil, wrapped); !errors.As(err, &lerr) {
		t.Errorf("CheckLock of go-iptables' lock timeout = %v, want a *LockError", err)
	}
}
