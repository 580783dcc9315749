package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// peerName is the name of the far end of every veth: the client's and each
// pod's only interface.
const peerName = "eth0"

// linkUpTimeout bounds the wait for a new veth to report carrier.
const linkUpTimeout = 5 * time.Second

// withHandle runs fn with a netlink handle bound to ns.
func withHandle(ns *Namespace, fn func(h *netlink.Handle) error) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", ns.Name, err)
	}
	defer h.Close()
	return fn(h)
}

// addVeth creates a veth pair in ns named name, whose peer, eth0, is created
// directly in peer: neither end ever exists in the caller's namespace.
func addVeth(ns *Namespace, name string, peer *Namespace) error {
	return withHandle(ns, func(h *netlink.Handle) error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name},
			PeerName:      peerName,
			PeerNamespace: netlink.NsFd(peer.Fd()),
		}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", name, err)
		}
		return nil
	})
}

// loopbackUp brings up lo in ns.
func loopbackUp(ns *Namespace) error {
	return withHandle(ns, func(h *netlink.Handle) error {
		_, err := configure(h, "lo")
		return err
	})
}

// addr4 is an IPv4 address with the given scope, for configure.
func addr4(p netip.Prefix, scope netlink.Scope) *netlink.Addr {
	return &netlink.Addr{IPNet: ipNet(p), Scope: int(scope)}
}

// addr6 is an IPv6 address for configure, flagged nodad so that it is
// usable at once rather than tentative until duplicate address detection
// ends. Link-local addresses get link scope, as the kernel requires.
func addr6(p netip.Prefix) *netlink.Addr {
	scope := netlink.SCOPE_UNIVERSE
	if p.Addr().IsLinkLocalUnicast() {
		scope = netlink.SCOPE_LINK
	}
	return &netlink.Addr{IPNet: ipNet(p), Scope: int(scope), Flags: unix.IFA_F_NODAD}
}

// configure adds addrs to link name and brings it up.
func configure(h *netlink.Handle, name string, addrs ...*netlink.Addr) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	for _, a := range addrs {
		if err := h.AddrAdd(l, a); err != nil {
			return nil, fmt.Errorf("add %s to %s: %w", a.IPNet, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return l, nil
}

// addRoute adds r and names it in any error.
func addRoute(h *netlink.Handle, r *netlink.Route) error {
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("add route %s: %w", r, err)
	}
	return nil
}

// waitReady polls until link name in ns reports operational state up and
// none of its IPv6 addresses is still tentative. A veth end brought up
// before its peer gets carrier asynchronously, and packets sent before that
// are dropped. The addresses configure adds are never tentative (nodad),
// but the kernel adds the fe80:: address it generates when the link gets
// carrier and clears its tentative flag from a work queue, even with
// accept_dad=0; until then neighbour discovery cannot use it.
func waitReady(ns *Namespace, name string) error {
	return withHandle(ns, func(h *netlink.Handle) error {
		deadline := time.Now().Add(linkUpTimeout)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			l, err := h.LinkByName(name)
			if err != nil {
				return fmt.Errorf("find %s: %w", name, err)
			}
			state := "operationally " + l.Attrs().OperState.String()
			if l.Attrs().OperState == netlink.OperUp {
				addrs, err := h.AddrList(l, netlink.FAMILY_V6)
				switch {
				case errors.Is(err, unix.EINTR):
					// The kernel interrupts a dump that other changes (tests in
					// parallel) overlap; the next tick asks again.
					addrs, state = nil, "listed while addresses changed"
				case err != nil:
					return fmt.Errorf("addresses of %s: %w", name, err)
				default:
					state = ""
				}
				for _, a := range addrs {
					if a.Flags&unix.IFA_F_DADFAILED != 0 {
						return fmt.Errorf("%s in %s: duplicate address detection failed for %s", name, ns.Name, a.IPNet)
					}
					if a.Flags&unix.IFA_F_TENTATIVE != 0 {
						state = a.IPNet.String() + " tentative"
					}
				}
				if state == "" {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s still %s after %v", name, ns.Name, state, linkUpTimeout)
			}
			<-tick.C
		}
	})
}

// ipNet converts a prefix to the address-with-mask form netlink wants.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// hostNet is the /32 (or /128) holding a single address.
func hostNet(a netip.Addr) *net.IPNet {
	return ipNet(netip.PrefixFrom(a, a.BitLen()))
}

// ip converts an address to net.IP.
func ip(a netip.Addr) net.IP {
	return a.AsSlice()
}
