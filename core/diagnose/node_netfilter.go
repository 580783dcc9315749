package diagnose

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables"

	"github.com/weirproxy/weir/backends/iptables"
	"github.com/weirproxy/weir/internal/kernelver"
)

// kernel reports the running kernel's release, Broken when it is older
// than Weir supports.
func (c *nodeCheck) kernel() []Finding {
	release, err := c.release()
	if err != nil {
		return []Finding{c.failed("the kernel version", err)}
	}
	ok, err := c.atLeast(kernelver.Minimum)
	switch {
	case err != nil:
		return []Finding{c.failed("the kernel version", err)}
	case !ok:
		return []Finding{nodeFinding("node.kernel-unsupported", Broken,
			"kernel %s is older than %s, the oldest Weir supports and tests: features Weir's rules rely on may be missing "+
				"or behave differently; upgrade the kernel", release, kernelver.Minimum)}
	}
	return []Finding{nodeFinding("node.kernel", Info, "kernel %s", release)}
}

// features checks that the kernel interfaces and tools of Weir's mode are
// there: nf_tables over netlink, the iptables binaries, IPVS.
func (c *nodeCheck) features() []Finding {
	switch c.o.Mode {
	case "nftables":
		_, err := c.nft.tables()
		switch {
		case errors.Is(err, os.ErrPermission):
			return []Finding{c.failed("nftables", fmt.Errorf("%w (run diagnose as root)", err))}
		case err != nil:
			return []Finding{nodeFinding("node.nftables-unavailable", Broken,
				"cannot list the nftables tables over netlink (%v): mode nftables cannot program this kernel; "+
					"it needs nf_tables (CONFIG_NF_TABLES), or use mode iptables", err)}
		}
	case "iptables":
		return c.iptablesTools()
	case "ipvs":
		out := c.iptablesTools() // for the masquerade rules
		_, err := os.Stat(c.procNet("ip_vs"))
		switch {
		case errors.Is(err, os.ErrNotExist):
			out = append(out, nodeFinding("node.ipvs-missing", Broken,
				"the kernel has no IPVS (no /proc/net/ip_vs): the ip_vs modules are not loaded, so mode ipvs cannot program "+
					"services; load them (modprobe ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh) or use mode nftables"))
		case err != nil:
			out = append(out, c.failed("IPVS", err))
		}
		return out
	}
	return nil
}

// iptablesTools checks that the iptables binaries of Weir's flavour are
// installed where Weir looks for them; with the flavour unknown, those of
// either.
func (c *nodeCheck) iptablesTools() []Finding {
	flavours := []string{c.o.IptablesFlavour}
	if c.o.IptablesFlavour == "" {
		flavours = iptablesFlavours
	}
	for _, f := range flavours {
		if iptables.Installed(f) {
			return nil
		}
	}
	what := fmt.Sprintf("the iptables-%[1]s binaries (iptables-%[1]s, iptables-%[1]s-restore, iptables-%[1]s-save "+
		"and their ip6tables twins) are not all installed", flavours[0])
	if len(flavours) > 1 {
		what = "neither the iptables-nft nor the iptables-legacy binaries are installed"
	}
	return []Finding{nodeFinding("node.iptables-missing", Broken,
		"%s in /usr/sbin, /sbin or /usr/local/sbin: weir run in mode %s cannot write its rules; install the iptables package",
		what, c.o.Mode)}
}

// iptablesFlavours are the two iptables flavours, by their binaries' infix.
var iptablesFlavours = []string{"nft", "legacy"}

// nftLister lists the nftables tables once per run, in the namespace of
// the thread that first asks.
type nftLister struct {
	listed bool
	conn   *nftables.Conn
	list   []*nftables.Table
	err    error
}

// tables returns the kernel's nftables tables of every family.
func (l *nftLister) tables() ([]*nftables.Table, error) {
	if !l.listed {
		l.listed = true
		l.conn, l.err = nftables.New()
		if l.err == nil {
			l.list, l.err = l.conn.ListTables()
		}
	}
	return l.list, l.err
}

// has reports whether the kernel has the table name of family f.
func (l *nftLister) has(f nftables.TableFamily, name string) (bool, error) {
	list, err := l.tables()
	for _, t := range list {
		if t.Family == f && t.Name == name {
			return true, nil
		}
	}
	return false, err
}

// hasChain reports whether the kernel has the chain in the table name of
// family f.
func (l *nftLister) hasChain(f nftables.TableFamily, table, chain string) (bool, error) {
	if ok, err := l.has(f, table); !ok || err != nil {
		return false, err
	}
	chains, err := l.conn.ListChainsOfTableFamily(f)
	for _, ch := range chains {
		if ch.Table.Name == table && ch.Name == chain {
			return true, nil
		}
	}
	return false, err
}
