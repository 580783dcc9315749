package nftables

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
)

// setSysctl writes a sysctl of the network namespace netnsFd (0: the
// caller's own), e.g. "net/ipv4/conf/all/route_localnet".
func setSysctl(netnsFd int, key, value string) error {
	path := filepath.Join("/proc/sys", key)
	if netnsFd == 0 {
		return os.WriteFile(path, []byte(value), 0o644)
	}
	// A thread switched into the namespace sees its /proc/sys/net.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(netns.NsHandle(netnsFd)); err != nil {
		return fmt.Errorf("enter network namespace: %w", err)
	}
	werr := os.WriteFile(path, []byte(value), 0o644)
	if err := netns.Set(orig); err != nil {
		// The thread cannot go back: keep it locked so the runtime ends it.
		runtime.LockOSThread()
		return fmt.Errorf("leave network namespace: %w", err)
	}
	return werr
}
