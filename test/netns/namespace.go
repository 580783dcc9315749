// Package netns builds a small Kubernetes-like cluster out of Linux network
// namespaces on one machine, for kernel tests of Weir's backends and for the
// demo.
//
// A Topology has a node namespace, where Weir runs and programs the kernel,
// a client namespace outside the node, and any number of pod namespaces,
// each joined to the node by its own veth pair. Pods run small TCP and UDP
// servers that answer every connection or datagram with one line naming the
// pod and the source address it saw, so tests can assert which pod answered
// and whether the source was masqueraded.
//
// Everything lives inside namespaces the Topology creates: no interface,
// address or route is ever added to the caller's namespace (each veth is
// created in the node with its peer placed directly in the other
// namespace), and Close removes all of it. Creating namespaces needs root
// (CAP_SYS_ADMIN and CAP_NET_ADMIN).
//
// The node and the client are dual-stack; each pod is IPv4-only unless its
// PodSpec has an IP6.
//
// # Addressing and routing
//
//   - Client link: the node holds NodeIP (172.30.0.1/24 by default) and
//     NodeIP6 (fd00:172:30::1/64), the client ClientIP (172.30.0.2/24) and
//     ClientIP6 (fd00:172:30::2/64). The client's default routes are the
//     node, so it reaches service VIPs, NodePorts and pod IPs through it.
//   - The node's default routes point back at the client, as a real node's
//     point at its upstream gateway. That gives locally generated packets
//     to a service VIP (or any external or load-balancer address) a route,
//     and so a source address, before the output hook's DNAT rewrites them
//     and the kernel reroutes them to a pod. A packet nobody rewrites is
//     handed to the client, which does not forward, and dies there: no
//     traffic can leave the namespaces. The node sends no ICMP redirects
//     (for IPv6, which has no send_redirects, because the kernel redirects
//     only to a link-local gateway or to the destination itself, and the
//     node's IPv6 gateway is the client's global ClientIP6).
//   - Pods: each pod holds its IP as a /32 on eth0 and a default route via
//     PodGateway (169.254.1.1) with onlink. The node's end of the veth holds
//     169.254.1.1/32 with link scope, so it answers the pod's ARP without
//     proxy ARP, and, being link-scoped, is never picked as a source address
//     (masquerade picks NodeIP). The node routes each pod's /32 to its veth
//     with NodeIP as preferred source, so node-to-pod traffic comes from
//     NodeIP too.
//   - Dual-stack pods also hold their IP6 as a /128 on eth0 with an IPv6
//     default route via PodGateway6 (fe80::1), which the node's end of the
//     veth holds; the node routes each pod's /128 to its veth with NodeIP6
//     as preferred source.
//   - ICMP and ICMPv6 rate limiting are off in every namespace
//     (icmp_ratemask=0; icmp.ratelimit=0 and an empty icmp.ratemask for
//     IPv6), so a reject answers every probe, not six and then one a
//     second.
//   - IPv6 duplicate address detection is off everywhere (accept_dad=0,
//     and every address is added nodad), so addresses are usable at once;
//     New waits, with a deadline, for the fe80:: addresses the kernel adds
//     itself to leave the tentative state.
package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/internal/nsenter"
)

// runDir is where named namespaces are bind-mounted, as iproute2 expects.
const runDir = "/run/netns"

// Namespace is a named network namespace, visible to `ip netns` while open.
type Namespace struct {
	// Name is the namespace's name under /run/netns.
	Name string

	mu     sync.Mutex
	handle netns.NsHandle // -1 once closed
}

// newNamespace creates a network namespace and bind-mounts it at
// /run/netns/<name>. The calling thread's namespace is never changed.
func newNamespace(name string) (*Namespace, error) {
	if err := prepareRunDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(runDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	f.Close()
	err = nsenter.OnThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		return unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
	})
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open namespace %s: %w", name, err), unmount(path))
	}
	return &Namespace{Name: name, handle: h}, nil
}

// runDirOnce makes runDir a shared mount point of its own once per process.
var runDirOnce = sync.OnceValue(func() error {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	if unix.Mount("", runDir, "", unix.MS_SHARED|unix.MS_REC, "") == nil {
		return nil // a mount point already
	}
	if err := unix.Mount(runDir, runDir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", runDir, err)
	}
	return unix.Mount("", runDir, "", unix.MS_SHARED|unix.MS_REC, "")
})

// prepareRunDir makes runDir a shared mount point, as `ip netns add` does
// before its first namespace. Without it, the first `ip netns add` run by
// anything else (a benchmark, a developer) mounts runDir onto itself over
// the namespaces this process already mounted there, which then can no
// longer be unmounted and leak.
func prepareRunDir() error { return runDirOnce() }

// unmount detaches the namespace's bind mount and removes the mount point.
func unmount(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		err = nil // not mounted
	}
	if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = errors.Join(err, rmErr)
	}
	return err
}

// close releases the handle and the bind mount. The kernel destroys the
// namespace, with its interfaces, once no socket or process still uses it.
// close is idempotent.
func (n *Namespace) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.handle == -1 {
		return nil
	}
	err := n.handle.Close()
	n.handle = -1
	if uerr := unmount(filepath.Join(runDir, n.Name)); uerr != nil {
		err = errors.Join(err, fmt.Errorf("remove namespace %s: %w", n.Name, uerr))
	}
	return err
}

// Fd returns a file descriptor referring to the namespace, valid until the
// Topology is closed; e.g. for nftables.New(nftables.WithNetNSFd(fd)) or
// netns.NsHandle(fd).
func (n *Namespace) Fd() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return int(n.handle)
}

// Do runs fn on an OS thread switched into the namespace and returns fn's error.
//
// fn runs on its own goroutine, locked to its thread. Sockets fn creates
// stay in the namespace after Do returns; goroutines fn starts do not run
// in the namespace.
func (n *Namespace) Do(fn func() error) error {
	n.mu.Lock()
	h := n.handle
	n.mu.Unlock()
	if h == -1 {
		return fmt.Errorf("namespace %s is closed", n.Name)
	}
	return nsenter.OnThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter namespace %s: %w", n.Name, err)
		}
		return fn()
	})
}

// Sysctl writes value to the namespace's sysctl key, e.g.
// Sysctl("net.ipv4.ip_forward", "1").
func (n *Namespace) Sysctl(key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return n.Do(func() error {
		// /proc/sys/net resolves against the opening thread's namespace.
		return os.WriteFile(path, []byte(value), 0o644)
	})
}

// Command returns a command that runs name with args inside the namespace,
// through `ip netns exec`.
func (n *Namespace) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}
