package xtables

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LockWait is how long an iptables command waits for the xtables lock
// before it gives up, kube-proxy's bound: another process holding the lock
// then fails one sync, which is retried, instead of stalling every sync.
//
// Only iptables-legacy takes the lock; iptables-nft accepts the wait
// arguments and ignores them (its changes are nftables transactions).
const LockWait = 5 * time.Second

// WaitArgs returns the arguments that make iptables and iptables-restore
// wait at most LockWait for the xtables lock. (iptables 1.8.9 ignores
// --wait-interval, so it is not passed.)
func WaitArgs() []string {
	return []string{"--wait", strconv.Itoa(int(LockWait / time.Second))}
}

// defaultLockFile is where iptables keeps its lock unless XTABLES_LOCKFILE
// names another file. The lock is one for the whole machine: network
// namespaces do not have their own.
const defaultLockFile = "/run/xtables.lock"

// LockFile returns the path of the xtables lock the iptables tools take:
// $XTABLES_LOCKFILE, which they honour too, or /run/xtables.lock.
func LockFile() string {
	if p := os.Getenv("XTABLES_LOCKFILE"); p != "" {
		return p
	}
	return defaultLockFile
}

// LockError says that an iptables tool gave up waiting for the xtables
// lock because another process held it.
type LockError struct {
	// Tool is the binary that gave up.
	Tool string
	// File is the lock file.
	File string
	// Holder describes the process holding the lock, "pid 123 (iptables)",
	// or is empty when it could not be told.
	Holder string
	// Err is the tool's exit error.
	Err error
}

func (e *LockError) Error() string {
	holder := "another process"
	if e.Holder != "" {
		holder = e.Holder
	}
	return fmt.Sprintf("iptables: %s gave up after %s waiting for the xtables lock %s, held by %s",
		e.Tool, LockWait, e.File, holder)
}

func (e *LockError) Unwrap() error { return e.Err }

// lockExit is the exit status of iptables tools that could not get the
// lock (RESOURCE_PROBLEM).
const lockExit = 4

// CheckLock returns a *LockError when a run of tool that failed with err
// and stderr gave up waiting for the xtables lock, and nil otherwise. It
// names the holder when /proc/locks tells it. A nil stderr means that
// err's text holds it, as go-iptables' errors do.
func CheckLock(tool string, stderr []byte, err error) error {
	if err == nil {
		return nil
	}
	if stderr == nil {
		stderr = []byte(err.Error())
	}
	var exit interface{ ExitCode() int }
	if !bytes.Contains(stderr, []byte("xtables lock")) || (errors.As(err, &exit) && exit.ExitCode() != lockExit) {
		return nil
	}
	file := LockFile()
	return &LockError{Tool: tool, File: file, Holder: lockHolder(file), Err: err}
}

// lockHolder describes the process holding an flock on file, from
// /proc/locks and /proc/PID/comm, or returns "" when it cannot tell.
func lockHolder(file string) string {
	var st unix.Stat_t
	if unix.Stat(file, &st) != nil {
		return ""
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return ""
	}
	pid := flockHolder(locks, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	if pid <= 0 {
		return ""
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
}

// flockHolder finds, in the text of /proc/locks, the process holding an
// FLOCK on the inode ino of device major:minor (printed "fe:00:123"); 0
// when none does. Lines of waiters ("1: -> FLOCK ...") are skipped.
func flockHolder(locks []byte, major, minor uint32, ino uint64) int {
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, ino)
	sc := bufio.NewScanner(bytes.NewReader(locks))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// "1:" "FLOCK" "ADVISORY" "WRITE" pid dev:inode start end
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil {
			return pid
		}
	}
	return 0
}
