// Package sysctl writes kernel parameters of a network namespace.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/weirproxy/weir/internal/nsenter"
)

// Set writes value to the sysctl key, e.g. "net/ipv4/ip_forward", of the
// network namespace open as netnsFd (0: the caller's own). A thread
// switched into the namespace sees that namespace's /proc/sys/net.
func Set(netnsFd int, key, value string) error {
	write := func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
		}
		return nil
	}
	if netnsFd == 0 {
		return write()
	}
	return nsenter.Do(netnsFd, write)
}
