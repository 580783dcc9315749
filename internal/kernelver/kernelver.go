// Package kernelver tells whether the running Linux kernel is one Weir
// supports: 6.1 or newer, the oldest kernel its tests run on (Debian 12's,
// in the VM of make test-vm). Weir needs nf_tables with concatenated sets
// and verdict maps, numgen and fib expressions, conntrack over netlink,
// and for mode ipvs the ip_vs modules with ipset; older kernels have most
// of these but are not tested.
package kernelver

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Minimum is the oldest kernel release Weir supports, as major.minor.
const Minimum = "6.1"

// Release returns the running kernel's release string, as uname -r prints it.
func Release() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// Supported returns nil when the running kernel is Minimum or newer, and
// otherwise an error that names both releases.
func Supported() error {
	release, err := Release()
	if err != nil {
		return err
	}
	return check(release)
}

// AtLeast reports whether the running kernel is version (major.minor) or
// newer.
func AtLeast(version string) (bool, error) {
	release, err := Release()
	if err != nil {
		return false, err
	}
	got, ok1 := majorMinor(release)
	want, ok2 := majorMinor(version)
	if !ok1 || !ok2 {
		return false, fmt.Errorf("compare kernel %q with %q: cannot read the versions", release, version)
	}
	return !less(got, want), nil
}

func less(a, b [2]int) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }

// check compares a release string such as "6.1.0-28-cloud-amd64" with
// Minimum.
func check(release string) error {
	got, ok := majorMinor(release)
	if !ok {
		return fmt.Errorf("kernel release %q: cannot read its version", release)
	}
	want, _ := majorMinor(Minimum)
	if less(got, want) {
		return fmt.Errorf("kernel %s is older than %s, the oldest Weir supports and tests", release, Minimum)
	}
	return nil
}

// majorMinor reads the first two numbers of a release string.
func majorMinor(release string) ([2]int, bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	major, err1 := strconv.Atoi(parts[0])
	digits := parts[1]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i] // "1-rc1": 1
	}
	minor, err2 := strconv.Atoi(digits)
	if err1 != nil || err2 != nil {
		return [2]int{}, false
	}
	return [2]int{major, minor}, true
}
