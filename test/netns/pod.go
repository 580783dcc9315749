package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
)

// PodSpec describes a pod to create.
type PodSpec struct {
	// Name is a DNS label; it names the namespace and is what servers answer.
	Name string
	// IP is the pod's address, a host address inside the pod CIDR.
	IP netip.Addr
	// IP6, if set, makes the pod dual-stack: it is the pod's IPv6 address,
	// a host address inside the IPv6 pod CIDR. A pod without one has no
	// IPv6 address or route beyond the kernel's fe80:: address on eth0.
	IP6 netip.Addr
	// Ports get a TCP and a UDP server each, on IPv6 too for a dual-stack pod.
	Ports []uint16
}

// Pod is a namespace behind its own veth pair, running answer servers.
type Pod struct {
	// Name is the pod's name, as its servers answer it.
	Name string
	// IP is the pod's address, a /32 on its eth0.
	IP netip.Addr
	// IP6 is the pod's IPv6 address, a /128 on its eth0, or the zero Addr
	// for an IPv4-only pod.
	IP6 netip.Addr
	// NS is the pod's namespace; dial from it for pod-to-service tests.
	NS *Namespace
	// Link is the name, in the node, of the node's end of the pod's veth.
	Link string

	mu      sync.Mutex
	servers []*server
	closed  bool
}

// AddPod creates a pod namespace, joins it to the node and starts its
// servers. If a step fails, the half-built pod is removed.
func (t *Topology) AddPod(spec PodSpec) (*Pod, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("netns: topology is closed")
	}
	if err := t.validate(spec); err != nil {
		return nil, err
	}
	ns, err := t.namespace("pod-" + spec.Name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Name: spec.Name, IP: spec.IP, IP6: spec.IP6, NS: ns, Link: "w" + t.ID + "p" + strconv.Itoa(t.nextIdx)}
	t.nextIdx++
	if err := t.wirePod(p); err != nil {
		return nil, errors.Join(fmt.Errorf("pod %s: %w", p.Name, err), p.close())
	}
	for _, port := range spec.Ports {
		if err := p.Listen(port); err != nil {
			return nil, errors.Join(err, p.close())
		}
	}
	t.Pods[p.Name] = p
	return p, nil
}

// wirePod joins p to the node. The pod holds its IP as a /32 and routes
// everything via PodGateway, which answers ARP from the node's end of the
// veth; the node routes the pod's /32 to that end with NodeIP as preferred
// source, so node-originated traffic carries the node IP rather than the
// link-scoped gateway address.
//
// A dual-stack pod likewise holds its IP6 as a /128 and routes IPv6 via
// PodGateway6 (fe80::1), which the node's end of the veth holds and so
// answers neighbour solicitations for; a link-local gateway needs no
// onlink. The node routes the pod's /128 to the veth with NodeIP6 as
// preferred source.
func (t *Topology) wirePod(p *Pod) error {
	if err := t.step("pod " + p.Name); err != nil {
		return err
	}
	if err := addVeth(t.Node, p.Link, p.NS); err != nil {
		return err
	}
	dual := p.IP6.IsValid()
	err := withHandle(t.Node, func(h *netlink.Handle) error {
		addrs := []*netlink.Addr{addr4(netip.PrefixFrom(PodGateway, 32), netlink.SCOPE_LINK)}
		if dual {
			addrs = append(addrs, addr6(netip.PrefixFrom(PodGateway6, 64)))
		}
		l, err := configure(h, p.Link, addrs...)
		if err != nil {
			return err
		}
		err = addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Dst: hostNet(p.IP),
			Scope: netlink.SCOPE_LINK, Src: ip(t.NodeIP)})
		if err != nil || !dual {
			return err
		}
		return addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Dst: hostNet(p.IP6), Src: ip(t.NodeIP6)})
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	err = withHandle(p.NS, func(h *netlink.Handle) error {
		addrs := []*netlink.Addr{addr4(netip.PrefixFrom(p.IP, 32), netlink.SCOPE_UNIVERSE)}
		if dual {
			addrs = append(addrs, addr6(netip.PrefixFrom(p.IP6, 128)))
		}
		l, err := configure(h, peerName, addrs...)
		if err != nil {
			return err
		}
		err = addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(PodGateway),
			Flags: int(netlink.FLAG_ONLINK)})
		if err != nil || !dual {
			return err
		}
		return addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(PodGateway6)})
	})
	if err != nil {
		return err
	}
	if err := waitReady(t.Node, p.Link); err != nil {
		return err
	}
	return waitReady(p.NS, peerName)
}

// Listen starts a TCP and a UDP server on port in the pod, on all IPv4
// addresses and, for a dual-stack pod, on its IP6.
func (p *Pod) Listen(port uint16) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("netns: pod %s is closed", p.Name)
	}
	s, err := startServer(p.NS, p.Name, port, p.IP6)
	if err != nil {
		return fmt.Errorf("pod %s: %w", p.Name, err)
	}
	p.servers = append(p.servers, s)
	return nil
}

// close stops the pod's servers and removes its namespace, which deletes
// the veth pair and the node's route to the pod.
func (p *Pod) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, s := range p.servers {
		errs = append(errs, s.close())
	}
	errs = append(errs, p.NS.close())
	return errors.Join(errs...)
}
