// Package sysctl writes kernel parameters of a network namespace.
package sysctl

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weirproxy/weir/internal/nsenter"
)

// RootEnv names the environment variable that moves the sysctl tree from
// /proc/sys, for containers whose /proc/sys is read-only: the DaemonSet
// mounts the node's /proc/sys/net at /host/proc/sys/net and sets it to
// /host/proc/sys. The files under net/ belong to the network namespace of
// the thread that opens them, wherever procfs is mounted.
const RootEnv = "WEIR_PROC_SYS"

// Set makes the sysctl key, e.g. "net/ipv4/ip_forward", hold value in the
// network namespace open as netnsFd (0: the caller's own). It writes only
// when the value differs, so a read-only tree whose values are already
// right is fine. A thread switched into the namespace sees that
// namespace's net/ keys.
func Set(netnsFd int, key, value string) error {
	root := os.Getenv(RootEnv)
	if root == "" {
		root = "/proc/sys"
	}
	path := filepath.Join(root, key)
	write := func() error {
		if cur, err := os.ReadFile(path); err == nil && string(bytes.TrimSpace(cur)) == value {
			return nil
		}
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
		}
		return nil
	}
	if netnsFd == 0 {
		return write()
	}
	return nsenter.Do(netnsFd, write)
}
