package diagnose

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/internal/kernelver"
	"github.com/weirproxy/weir/internal/nsenter"
)

// nodeSubject is the Subject of every node finding.
const nodeSubject = "node"

// NodeOptions says what CheckNode looks at: Weir's configuration as far as
// the node checks need it, and where the kernel's files are.
type NodeOptions struct {
	// Mode is Weir's configured mode: "nftables", "iptables" or "ipvs".
	Mode string
	// IptablesFlavour is the iptables flavour Weir uses in modes iptables
	// and ipvs, "nft" or "legacy"; "" or "auto" when unknown (the config's
	// "auto", which weir run resolves when it starts).
	IptablesFlavour string
	// NFTablesTable is the table Weir owns in mode nftables; "weir" when
	// empty.
	NFTablesTable string
	// IPVSInterface is the dummy interface Weir holds service addresses on
	// in mode ipvs; "weir-ipvs0" when empty.
	IPVSInterface string
	// LocalhostNodePorts says that Weir serves node ports on 127.0.0.1:
	// the config's localhostNodePorts is on and its nodePortAddresses is
	// all (with primary or CIDRs, Weir serves none on loopback).
	LocalhostNodePorts bool
	// HealthzAddress and MetricsAddress are the servers' host:port from
	// the config; "" means the server is off.
	HealthzAddress, MetricsAddress string
	// DualStack also checks the IPv6 settings.
	DualStack bool
	// ProcRoot is where procfs is mounted; "/proc" when empty.
	ProcRoot string
	// SysRoot is where sysfs is mounted; "/sys" when empty. Its
	// class/net lists the interfaces of the network namespace sysfs was
	// mounted in, whatever NetNS says.
	SysRoot string
	// NetNS is an open file descriptor of the network namespace to
	// check; 0 checks the caller's own.
	NetNS int
}

// CheckNode runs every node check and returns its findings, all with
// Subject "node": Broken and Warning ones for what loses traffic, and a
// few Info ones (the kernel release, the conntrack table's use). A check
// that cannot run says so in a Warning (code node.check-failed); CheckNode
// itself never fails.
func CheckNode(ctx context.Context, o NodeOptions) []Finding {
	c := newNodeCheck(ctx, o)
	if o.NetNS == 0 {
		return c.all()
	}
	var out []Finding
	err := nsenter.Do(o.NetNS, func() error {
		out = c.all()
		return nil
	})
	if err != nil {
		return []Finding{c.failed("the node", err)}
	}
	return out
}

// nodeCheck holds one CheckNode run's options and the parts of the
// kernel that tests replace.
type nodeCheck struct {
	ctx context.Context
	o   NodeOptions
	// release and atLeast are kernelver's.
	release func() (string, error)
	atLeast func(version string) (bool, error)
	// nft lists nftables tables and chains, once per run.
	nft *nftLister
	// natServices returns the IP families whose nat table of an iptables
	// flavour has kube-proxy's KUBE-SERVICES chain (servicesChain).
	natServices func(flavour string) ([]string, error)
}

func newNodeCheck(ctx context.Context, o NodeOptions) *nodeCheck {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.SysRoot == "" {
		o.SysRoot = "/sys"
	}
	if o.IptablesFlavour == "auto" {
		o.IptablesFlavour = ""
	}
	if o.NFTablesTable == "" {
		o.NFTablesTable = "weir"
	}
	if o.IPVSInterface == "" {
		o.IPVSInterface = "weir-ipvs0"
	}
	c := &nodeCheck{ctx: ctx, o: o, release: kernelver.Release, atLeast: kernelver.AtLeast, nft: &nftLister{}}
	c.natServices = c.servicesChain
	return c
}

// all runs the checks in the order their findings are listed: the kernel,
// the netfilter tools, other proxies, the sysctls, then the servers. It
// runs on one thread, which CheckNode may have switched into NetNS.
func (c *nodeCheck) all() []Finding {
	var out []Finding
	for _, check := range []func() []Finding{
		c.kernel, c.features, c.otherProxies,
		c.forwarding, c.routeLocalnet, c.bridgeNF, c.rpFilter, c.conntrack,
		c.servers,
	} {
		out = append(out, check()...)
	}
	return out
}

// nodeFinding returns a finding about the node.
func nodeFinding(code string, sev Severity, format string, args ...any) Finding {
	return Finding{Code: code, Severity: sev, Subject: nodeSubject, Message: fmt.Sprintf(format, args...)}
}

// failed is the Warning of a check that could not run.
func (c *nodeCheck) failed(what string, err error) Finding {
	return nodeFinding("node.check-failed", Warning, "could not check %s: %v", what, err)
}

// errNoFile marks a sysctl or proc file that does not exist.
var errNoFile = errors.New("no such file")

// sysctl returns the value of key (net.ipv4.ip_forward) under
// ProcRoot/sys, trimmed; an error wrapping errNoFile when it does not
// exist. The net.* files show the reading thread's network namespace.
func (c *nodeCheck) sysctl(key string) (string, error) {
	path := filepath.Join(c.o.ProcRoot, "sys", strings.ReplaceAll(key, ".", "/"))
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", path, errNoFile)
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// sysctlInt returns the value of key as an integer.
func (c *nodeCheck) sysctlInt(key string) (int64, error) {
	s, err := c.sysctl(key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: not a number: %q", key, s)
	}
	return n, nil
}

// procNet returns the path of name in the reading thread's /proc/net.
func (c *nodeCheck) procNet(name string) string {
	return filepath.Join(c.o.ProcRoot, "thread-self", "net", name)
}
