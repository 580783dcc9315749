package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// ensureDummy returns the dummy interface name, creating it when missing,
// and brings it up.
func ensureDummy(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		if err := h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return nil, fmt.Errorf("ipvs: create dummy interface %s: %w", name, err)
		}
		l, err = h.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("ipvs: find interface %s: %w", name, err)
	}
	if l.Type() != "dummy" {
		return nil, fmt.Errorf("ipvs: interface %s is a %s, want a dummy interface", name, l.Type())
	}
	if err := h.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("ipvs: bring up interface %s: %w", name, err)
	}
	return l, nil
}

// linkAddrs returns the addresses on the link, except link-local ones
// (the kernel's own IPv6 fe80:: address), which Weir never manages.
func linkAddrs(h *netlink.Handle, l netlink.Link) ([]netip.Addr, error) {
	list, err := addrList(h, l)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list addresses of interface %s: %w", l.Attrs().Name, err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// addrList lists the addresses of l (nil: all), again when the kernel
// marks the dump interrupted by a concurrent change (netlink returns
// EINTR; seen when a test namespace's interfaces were still settling),
// up to five tries.
func addrList(h *netlink.Handle, l netlink.Link) ([]netlink.Addr, error) {
	for try := 1; ; try++ {
		list, err := h.AddrList(l, netlink.FAMILY_ALL)
		if !errors.Is(err, unix.EINTR) || try == 5 {
			return list, err
		}
	}
}

// hostAddr returns a as a netlink address with a host prefix (/32, /128).
// IPv6 addresses skip duplicate address detection so they work at once,
// and are deprecated (valid forever, preferred for no time): IPv6 source
// selection would otherwise pick a service address, the longest match,
// for the node's own connections and for masquerading towards pods. A
// deprecated address still receives, and is still the source of
// connections to itself.
func hostAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
		na.ValidLft, na.PreferedLft = lifetimeForever, 0
	}
	return na
}

// lifetimeForever is the kernel's infinite address lifetime.
const lifetimeForever = 0xffffffff

func addAddr(h *netlink.Handle, l netlink.Link, a netip.Addr) error {
	if err := h.AddrReplace(l, hostAddr(a)); err != nil {
		return fmt.Errorf("ipvs: add address %s to interface %s: %w", a, l.Attrs().Name, err)
	}
	return nil
}

func delAddr(h *netlink.Handle, l netlink.Link, a netip.Addr) error {
	err := h.AddrDel(l, hostAddr(a))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("ipvs: remove address %s from interface %s: %w", a, l.Attrs().Name, err)
	}
	return nil
}

// localAddrs returns the namespace's addresses that can take node ports:
// every address except loopback, link-local ones and those on the
// interface skip (Weir's own).
func localAddrs(h *netlink.Handle, skip int) ([]netip.Addr, error) {
	list, err := addrList(h, nil)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list local addresses: %w", err)
	}
	var out []netip.Addr
	for _, na := range list {
		a, ok := netip.AddrFromSlice(na.IP)
		if !ok || na.LinkIndex == skip {
			continue
		}
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || slices.Contains(out, a) {
			continue
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// nodePortAddrs picks the addresses node ports listen on from the local
// ones: those inside NodePortCIDRs when set, else the plan node's
// addresses when NodePortPrimary, else all of them.
func nodePortAddrs(o *backends.Common, node plan.Node, local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		switch {
		case len(o.NodePortCIDRs) > 0:
			if !slices.ContainsFunc(o.NodePortCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				continue
			}
		case o.NodePortPrimary:
			if !slices.ContainsFunc(node.Addresses, func(n netip.Addr) bool { return n.Unmap() == a }) {
				continue
			}
		}
		out = append(out, a)
	}
	return out
}
