package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kubeProxyInterface is the dummy interface kube-proxy's IPVS mode binds
// every cluster, external and load-balancer IP to.
const kubeProxyInterface = "kube-ipvs0"

// kubeProxySets are the ipsets kube-proxy's IPVS mode creates for IPv4, with
// the two SCTP sets of older releases. Its IPv6 sets are named KUBE-6-...
// instead of KUBE-..., cut to the 31 characters an ipset name may have.
var kubeProxySets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "KUBE-NODE-PORT-SCTP", "KUBE-NODE-PORT-LOCAL-SCTP",
	"KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}

// RemoveKubeProxy removes what kube-proxy's IPVS mode left that Weir does
// not program: the virtual servers on the addresses of kube-ipvs0 and those
// on the node's other addresses at a port of Options.NodePortRange, the
// interface kube-ipvs0, and kube-proxy's ipsets. Weir's own virtual
// servers stay, on any address; so do virtual servers of other programs
// (keepalived, kube-vip), which kube-proxy's cleanup would flush. Remove
// kube-proxy's iptables chains first (the iptables backend's Cleanup, in
// each flavour): the kernel keeps an ipset that a rule still uses.
func (b *Backend) RemoveKubeProxy(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.removeKubeProxy()
}

func (b *Backend) removeKubeProxy() error {
	link, onLink, err := b.kubeProxyLink()
	if err != nil {
		return err
	}
	skip := -1
	if link != nil {
		skip = link.Attrs().Index
	}
	local, err := localAddrs(b.nl, skip)
	if err != nil {
		return err
	}
	if _, err := b.deleteServers(b.kubeProxyScope(addrSet(onLink), addrSet(local))); err != nil {
		return fmt.Errorf("ipvs: delete kube-proxy's virtual servers: %w", err)
	}
	var errs []error
	if link != nil {
		if err := b.nl.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: delete kube-proxy's interface %s: %w", kubeProxyInterface, err))
		}
	}
	return errors.Join(append(errs, destroyKubeProxySets(b.sets))...)
}

// kubeProxyLink returns kube-proxy's interface and its addresses; no
// interface when there is none, or when Weir itself is configured to use
// that name.
func (b *Backend) kubeProxyLink() (netlink.Link, []netip.Addr, error) {
	if b.opts.Interface == kubeProxyInterface {
		return nil, nil, nil
	}
	link, err := b.nl.LinkByName(kubeProxyInterface)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("ipvs: find interface %s: %w", kubeProxyInterface, err)
	}
	addrs, err := linkAddrs(b.nl, link)
	return link, addrs, err
}

// kubeProxyScope says which virtual servers are kube-proxy's: not Weir's,
// without a firewall mark (kube-proxy uses none), and on an address of
// its interface or a node-port one: a local address at a port of the
// node-port range.
func (b *Backend) kubeProxyScope(onLink, local map[netip.Addr]bool) func(vsKey) bool {
	first, last := b.opts.nodePortRange()
	return func(k vsKey) bool {
		if b.programmed[k] != nil || k.mark != 0 {
			return false
		}
		return onLink[k.addr] || (local[k.addr] && k.port >= first && k.port <= last)
	}
}

// maxSetName is the longest name the kernel accepts for an ipset.
const maxSetName = 31

// destroyKubeProxySets destroys kube-proxy's ipsets of both families;
// missing ones are fine.
func destroyKubeProxySets(c ipsetConn) error {
	var errs []error
	for _, name := range kubeProxySets {
		v6 := strings.Replace(name, "KUBE-", "KUBE-6-", 1)
		for _, n := range []string{name, v6[:min(len(v6), maxSetName)]} {
			if err := c.IpsetDestroy(n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("ipvs: destroy kube-proxy's ipset %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}
