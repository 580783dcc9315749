package netns

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
		_, err := configure(h, "lo", netip.Prefix{}, netlink.SCOPE_UNIVERSE)
		return err
	})
}

// configure adds addr (if valid) with scope to link name and brings it up.
func configure(h *netlink.Handle, name string, addr netip.Prefix, scope netlink.Scope) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	if addr.IsValid() {
		a := &netlink.Addr{IPNet: ipNet(addr), Scope: int(scope)}
		if err := h.AddrAdd(l, a); err != nil {
			return nil, fmt.Errorf("add %s to %s: %w", addr, name, err)
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

// waitUp polls until link name in ns reports operational state up. A veth
// end brought up before its peer gets carrier asynchronously, and packets
// sent before that are dropped.
func waitUp(ns *Namespace, name string) error {
	return withHandle(ns, func(h *netlink.Handle) error {
		deadline := time.Now().Add(linkUpTimeout)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			l, err := h.LinkByName(name)
			if err != nil {
				return fmt.Errorf("find %s: %w", name, err)
			}
			if l.Attrs().OperState == netlink.OperUp {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s still %s after %v", name, ns.Name, l.Attrs().OperState, linkUpTimeout)
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
