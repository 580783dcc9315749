package nftables

import (
	"os"
	"path/filepath"

	"github.com/weirproxy/weir/internal/nsenter"
)

// setSysctl writes a sysctl of the network namespace netnsFd (0: the
// caller's own), e.g. "net/ipv4/conf/all/route_localnet". A thread switched
// into the namespace sees that namespace's /proc/sys/net.
func setSysctl(netnsFd int, key, value string) error {
	write := func() error { return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644) }
	if netnsFd == 0 {
		return write()
	}
	return nsenter.Do(netnsFd, write)
}
