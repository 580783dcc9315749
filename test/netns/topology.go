package netns

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sync"

	"github.com/vishvananda/netlink"
)

// PodGateway is the link-local address every pod uses as its default gateway.
// It sits, with link scope, on the node's end of each pod's veth.
var PodGateway = netip.MustParseAddr("169.254.1.1")

// PodGateway6 is the IPv6 default gateway of every dual-stack pod: a
// link-local address on the node's end of each such pod's veth.
var PodGateway6 = netip.MustParseAddr("fe80::1")

// The default address plan, used for the zero fields of Options.
var (
	// DefaultPodCIDR is the default Options.PodCIDR.
	DefaultPodCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// DefaultServiceCIDR is the default Options.ServiceCIDR.
	DefaultServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
	// DefaultClientSubnet is the default Options.ClientSubnet.
	DefaultClientSubnet = netip.MustParsePrefix("172.30.0.0/24")
	// DefaultPodCIDR6 is the default Options.PodCIDR6.
	DefaultPodCIDR6 = netip.MustParsePrefix("fd00:10:244::/64")
	// DefaultServiceCIDR6 is the default Options.ServiceCIDR6.
	DefaultServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/112")
	// DefaultClientSubnet6 is the default Options.ClientSubnet6.
	DefaultClientSubnet6 = netip.MustParsePrefix("fd00:172:30::/64")
)

// Options describes the cluster New builds; zero fields take the defaults.
type Options struct {
	// PodCIDR holds every pod IP.
	PodCIDR netip.Prefix
	// ServiceCIDR is where callers pick service VIPs; the harness only checks
	// that it overlaps nothing else (the node's default route covers it).
	ServiceCIDR netip.Prefix
	// ClientSubnet is the node–client link; the node takes its first host
	// address, the client the second.
	ClientSubnet netip.Prefix
	// PodCIDR6 holds every pod IPv6 address (PodSpec.IP6).
	PodCIDR6 netip.Prefix
	// ServiceCIDR6 is where callers pick IPv6 service VIPs, like ServiceCIDR.
	ServiceCIDR6 netip.Prefix
	// ClientSubnet6 is the IPv6 prefix of the node–client link; the node
	// takes its first host address, the client the second.
	ClientSubnet6 netip.Prefix
	// Pods are created in order by New.
	Pods []PodSpec

	// hook, set only by this package's tests, can fail setup at a step.
	hook func(t *Topology, step string) error
}

// Topology is a node namespace with a client namespace and pod namespaces
// attached to it by veth pairs.
type Topology struct {
	// ID is the random tag in every namespace and interface name of this run.
	ID string
	// Node is where Weir runs; it forwards between the client and the pods.
	Node *Namespace
	// Client is a host outside the node whose default route is the node.
	Client *Namespace
	// Pods maps pod names to pods. AddPod writes it: do not read it
	// concurrently with AddPod.
	Pods map[string]*Pod

	// NodeIP is the node's address on the client link: the node IP for
	// NodePorts and the source of node-originated traffic to pods.
	NodeIP netip.Addr
	// ClientIP is the client's address.
	ClientIP netip.Addr
	// NodeIP6 is the node's IPv6 address on the client link, the IPv6
	// counterpart of NodeIP.
	NodeIP6 netip.Addr
	// ClientIP6 is the client's IPv6 address.
	ClientIP6 netip.Addr
	// ClientLink is the name, in Node, of the node's end of the client link.
	ClientLink string

	PodCIDR     netip.Prefix // PodCIDR is the validated Options.PodCIDR.
	ServiceCIDR netip.Prefix // ServiceCIDR is the validated Options.ServiceCIDR.

	PodCIDR6     netip.Prefix // PodCIDR6 is the validated Options.PodCIDR6.
	ServiceCIDR6 netip.Prefix // ServiceCIDR6 is the validated Options.ServiceCIDR6.

	mu      sync.Mutex
	nextIdx int
	closed  bool
	hook    func(t *Topology, step string) error
}

// New creates the node and client namespaces and the pods of opts. If any
// step fails, everything created so far is removed before New returns.
func New(opts Options) (*Topology, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	t := &Topology{
		ID:           id,
		Pods:         map[string]*Pod{},
		NodeIP:       opts.ClientSubnet.Addr().Next(),
		ClientIP:     opts.ClientSubnet.Addr().Next().Next(),
		NodeIP6:      opts.ClientSubnet6.Addr().Next(),
		ClientIP6:    opts.ClientSubnet6.Addr().Next().Next(),
		ClientLink:   "w" + id + "c",
		PodCIDR:      opts.PodCIDR,
		ServiceCIDR:  opts.ServiceCIDR,
		PodCIDR6:     opts.PodCIDR6,
		ServiceCIDR6: opts.ServiceCIDR6,
		hook:         opts.hook,
	}
	if err := t.build(opts); err != nil {
		return nil, errors.Join(err, t.Close())
	}
	return t, nil
}

// build creates everything New promises, in order.
func (t *Topology) build(opts Options) error {
	var err error
	if t.Node, err = t.namespace("node"); err != nil {
		return err
	}
	if err := t.setupNode(); err != nil {
		return err
	}
	if t.Client, err = t.namespace("client"); err != nil {
		return err
	}
	if err := t.setupClient(opts.ClientSubnet.Bits(), opts.ClientSubnet6.Bits()); err != nil {
		return err
	}
	for _, spec := range opts.Pods {
		if _, err := t.AddPod(spec); err != nil {
			return err
		}
	}
	return nil
}

// namespaceSysctls are written in every namespace before any interface
// is created in it, so the interfaces inherit the conf.default values:
//
//   - ICMP and ICMPv6 rate limiting off, so that rejects answer every
//     probe, not a burst of six and then one a second. For IPv6,
//     icmp.ratelimit=0 only lifts the per-destination limit; clearing
//     icmp.ratemask (by default 0-1,3-127) also exempts every ICMPv6 type
//     from the global icmp_msgs_per_sec budget, as icmp_ratemask=0 does
//     for IPv4.
//   - No duplicate address detection, so that IPv6 addresses are usable
//     at once (the kernel skips DAD only when both all and the interface
//     say so).
//   - No IPv6 redirects accepted.
var namespaceSysctls = [][2]string{
	{"net.ipv4.icmp_ratemask", "0"},
	{"net.ipv6.icmp.ratelimit", "0"},
	{"net.ipv6.icmp.ratemask", "\n"}, // an empty list; a write of nothing is a no-op
	{"net.ipv6.conf.all.accept_dad", "0"},
	{"net.ipv6.conf.default.accept_dad", "0"},
	{"net.ipv6.conf.all.accept_redirects", "0"},
	{"net.ipv6.conf.default.accept_redirects", "0"},
}

// namespace creates the namespace weir-<id>-<suffix>, brings up its
// loopback and applies namespaceSysctls.
func (t *Topology) namespace(suffix string) (*Namespace, error) {
	if err := t.step("namespace " + suffix); err != nil {
		return nil, err
	}
	ns, err := newNamespace(fmt.Sprintf("weir-%s-%s", t.ID, suffix))
	if err != nil {
		return nil, err
	}
	err = loopbackUp(ns)
	for _, kv := range namespaceSysctls {
		if err != nil {
			break
		}
		if err = ns.Sysctl(kv[0], kv[1]); err != nil {
			err = fmt.Errorf("%s=%q: %w", kv[0], kv[1], err)
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", ns.Name, err), ns.close())
	}
	return ns, nil
}

// step runs the test hook, if any.
func (t *Topology) step(name string) error {
	if t.hook == nil {
		return nil
	}
	return t.hook(t, name)
}

// setupNode turns on IPv4 and IPv6 forwarding in the node and turns off
// ICMP redirects: packets to addresses nobody rewrote leave the node on the
// client link they came in on, and a redirect would only add noise. Linux
// has no send_redirects for IPv6; it sends an IPv6 redirect only when the
// target is the destination itself or a link-local gateway, and the node's
// IPv6 default route uses the client's global address, so it never does.
func (t *Topology) setupNode() error {
	if err := t.step("node"); err != nil {
		return err
	}
	for key, value := range map[string]string{
		"net.ipv4.ip_forward":                  "1",
		"net.ipv4.conf.all.send_redirects":     "0",
		"net.ipv4.conf.default.send_redirects": "0",
		"net.ipv6.conf.all.forwarding":         "1",
	} {
		if err := t.Node.Sysctl(key, value); err != nil {
			return fmt.Errorf("node: %s=%s: %w", key, value, err)
		}
	}
	return nil
}

// setupClient wires the client to the node and points the client's default
// routes (IPv4 and IPv6) at the node and the node's default routes at the
// client.
func (t *Topology) setupClient(bits, bits6 int) error {
	if err := t.step("client"); err != nil {
		return err
	}
	if err := addVeth(t.Node, t.ClientLink, t.Client); err != nil {
		return fmt.Errorf("client link: %w", err)
	}
	err := withHandle(t.Node, func(h *netlink.Handle) error {
		l, err := configure(h, t.ClientLink, addr4(netip.PrefixFrom(t.NodeIP, bits), netlink.SCOPE_UNIVERSE),
			addr6(netip.PrefixFrom(t.NodeIP6, bits6)))
		if err != nil {
			return err
		}
		if err := addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(t.ClientIP)}); err != nil {
			return err
		}
		return addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(t.ClientIP6)})
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	err = withHandle(t.Client, func(h *netlink.Handle) error {
		l, err := configure(h, peerName, addr4(netip.PrefixFrom(t.ClientIP, bits), netlink.SCOPE_UNIVERSE),
			addr6(netip.PrefixFrom(t.ClientIP6, bits6)))
		if err != nil {
			return err
		}
		if err := addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(t.NodeIP)}); err != nil {
			return err
		}
		return addRoute(h, &netlink.Route{LinkIndex: l.Attrs().Index, Gw: ip(t.NodeIP6)})
	})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := waitReady(t.Node, t.ClientLink); err != nil {
		return err
	}
	return waitReady(t.Client, peerName)
}

// Close stops every pod server and removes every namespace, and with them
// every interface and route. It is safe to call more than once.
func (t *Topology) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for _, p := range t.Pods {
		errs = append(errs, p.close())
	}
	for _, ns := range []*Namespace{t.Client, t.Node} {
		if ns != nil {
			errs = append(errs, ns.close())
		}
	}
	return errors.Join(errs...)
}

// normalize fills defaults and checks that the address plan is coherent.
func (o *Options) normalize() error {
	fill := func(p *netip.Prefix, def netip.Prefix) {
		if !p.IsValid() {
			*p = def
		}
	}
	fill(&o.PodCIDR, DefaultPodCIDR)
	fill(&o.ServiceCIDR, DefaultServiceCIDR)
	fill(&o.ClientSubnet, DefaultClientSubnet)
	fill(&o.PodCIDR6, DefaultPodCIDR6)
	fill(&o.ServiceCIDR6, DefaultServiceCIDR6)
	fill(&o.ClientSubnet6, DefaultClientSubnet6)
	named := map[string]netip.Prefix{
		"pod CIDR": o.PodCIDR, "service CIDR": o.ServiceCIDR, "client subnet": o.ClientSubnet,
	}
	for name, p := range named {
		if !p.Addr().Is4() || p != p.Masked() {
			return fmt.Errorf("netns: %s %s: want a masked IPv4 prefix", name, p)
		}
		if p.Contains(PodGateway) {
			return fmt.Errorf("netns: %s %s contains the pod gateway %s", name, p, PodGateway)
		}
	}
	named6 := map[string]netip.Prefix{
		"pod CIDR6": o.PodCIDR6, "service CIDR6": o.ServiceCIDR6, "client subnet6": o.ClientSubnet6,
	}
	for name, p := range named6 {
		a := p.Addr()
		if !a.Is6() || a.Is4In6() || p != p.Masked() {
			return fmt.Errorf("netns: %s %s: want a masked IPv6 prefix", name, p)
		}
		if !a.IsGlobalUnicast() { // which also keeps PodGateway6 out
			return fmt.Errorf("netns: %s %s: want global or unique local unicast addresses", name, p)
		}
	}
	if o.ClientSubnet.Bits() > 30 {
		return fmt.Errorf("netns: client subnet %s: need room for two hosts", o.ClientSubnet)
	}
	if o.ClientSubnet6.Bits() > 126 {
		return fmt.Errorf("netns: client subnet6 %s: need room for two hosts", o.ClientSubnet6)
	}
	if o.PodCIDR.Overlaps(o.ServiceCIDR) || o.PodCIDR.Overlaps(o.ClientSubnet) ||
		o.ServiceCIDR.Overlaps(o.ClientSubnet) {
		return fmt.Errorf("netns: pod CIDR %s, service CIDR %s and client subnet %s must not overlap",
			o.PodCIDR, o.ServiceCIDR, o.ClientSubnet)
	}
	if o.PodCIDR6.Overlaps(o.ServiceCIDR6) || o.PodCIDR6.Overlaps(o.ClientSubnet6) ||
		o.ServiceCIDR6.Overlaps(o.ClientSubnet6) {
		return fmt.Errorf("netns: pod CIDR6 %s, service CIDR6 %s and client subnet6 %s must not overlap",
			o.PodCIDR6, o.ServiceCIDR6, o.ClientSubnet6)
	}
	return nil
}

// podName is what a pod name may look like: a short DNS label.
var podName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// validate checks spec against the topology's pods; t.mu must be held.
func (t *Topology) validate(spec PodSpec) error {
	if !podName.MatchString(spec.Name) {
		return fmt.Errorf("netns: pod name %q: want a DNS label of at most 32 characters", spec.Name)
	}
	if !t.PodCIDR.Contains(spec.IP) || spec.IP == t.PodCIDR.Addr() {
		return fmt.Errorf("netns: pod %s: IP %s is not a host address in %s", spec.Name, spec.IP, t.PodCIDR)
	}
	if spec.IP6.IsValid() && (spec.IP6.Is4In6() || spec.IP6.Zone() != "" ||
		!t.PodCIDR6.Contains(spec.IP6) || spec.IP6 == t.PodCIDR6.Addr()) {
		return fmt.Errorf("netns: pod %s: IP6 %s is not a host address in %s", spec.Name, spec.IP6, t.PodCIDR6)
	}
	for _, p := range t.Pods {
		if p.Name == spec.Name {
			return fmt.Errorf("netns: pod %s already exists", spec.Name)
		}
		if p.IP == spec.IP {
			return fmt.Errorf("netns: pod %s: IP %s already belongs to pod %s", spec.Name, spec.IP, p.Name)
		}
		if spec.IP6.IsValid() && p.IP6 == spec.IP6 {
			return fmt.Errorf("netns: pod %s: IP6 %s already belongs to pod %s", spec.Name, spec.IP6, p.Name)
		}
	}
	return nil
}

// randomID returns 6 random hex digits.
func randomID() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
