package conntrack

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/weirproxy/weir/internal/sysctl"
)

// Settings are the connection-tracking parameters of kube-proxy's
// conntrack section; a zero field leaves its kernel parameter alone.
type Settings struct {
	// Max is nf_conntrack_max; the hash table is then grown to at least
	// Max/4 buckets, as kube-proxy does.
	Max int
	// The TCP and UDP timeouts, in whole seconds in the kernel.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	UDPTimeout, UDPStreamTimeout               time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1.
	TCPBeLiberal bool
}

// MaxFor returns the nf_conntrack_max kube-proxy sets for perCore
// connections per CPU with a floor of floor: perCore times cpus, at least
// floor; 0 (leave it alone) when perCore is 0.
func MaxFor(perCore, floor, cpus int) int {
	if perCore <= 0 {
		return 0
	}
	return max(perCore*cpus, floor)
}

// CPUs counts the machine's online CPUs from sysfs, as kube-proxy does
// (a container's own CPU set may be smaller); runtime.NumCPU when sysfs
// cannot tell.
func CPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n, ok := countCPUs(strings.TrimSpace(string(b))); err == nil && ok {
		return n
	}
	return runtime.NumCPU()
}

// countCPUs counts a CPU list such as "0-3,6".
func countCPUs(list string) (int, bool) {
	n := 0
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a {
			return 0, false
		}
		n += b - a + 1
	}
	return n, n > 0
}

// hashsizePath is the conntrack hash table's size, a module parameter the
// kernel takes only from the initial network namespace.
var hashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"

// Apply writes s into the network namespace open as netnsFd (0: the
// caller's own), each parameter only when it differs. It returns one
// error per parameter it could not set, naming it. nf_conntrack_max can
// only be set from the initial network namespace; the hash table is grown
// only once it has been.
func Apply(netnsFd int, s Settings) []error {
	var errs []error
	set := func(name string, value int) error {
		err := sysctl.Set(netnsFd, "net/netfilter/"+name, strconv.Itoa(value))
		if err != nil {
			errs = append(errs, err)
		}
		return err
	}
	if s.Max > 0 && set("nf_conntrack_max", s.Max) == nil {
		if err := growHashTable(s.Max / 4); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", s.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", s.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", s.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", s.UDPStreamTimeout},
	} {
		if t.d > 0 {
			_ = set(t.name, int(t.d/time.Second))
		}
	}
	if s.TCPBeLiberal {
		_ = set("nf_conntrack_tcp_be_liberal", 1)
	}
	return errs
}

// growHashTable raises the conntrack hash table to at least buckets.
func growHashTable(buckets int) error {
	b, err := os.ReadFile(hashsizePath)
	if err != nil {
		return fmt.Errorf("conntrack hashsize: %w", err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("conntrack hashsize %q: %w", b, err)
	}
	if cur >= buckets {
		return nil
	}
	if err := os.WriteFile(hashsizePath, []byte(strconv.Itoa(buckets)), 0o640); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("conntrack hashsize %d: %w (a read-only /sys, as some container runtimes mount it)", buckets, err)
		}
		return fmt.Errorf("conntrack hashsize %d: %w", buckets, err)
	}
	return nil
}
