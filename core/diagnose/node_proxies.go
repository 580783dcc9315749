package diagnose

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// What kube-proxy leaves in the kernel, mode by mode.
const (
	// kubeProxyTable is its nftables mode's table, in families ip and ip6.
	kubeProxyTable = "kube-proxy"
	// kubeProxyServices is the nat chain its iptables and IPVS modes
	// dispatch service traffic from, in either iptables flavour.
	kubeProxyServices = "KUBE-SERVICES"
	// kubeProxyInterface holds every service address in its IPVS mode.
	kubeProxyInterface = "kube-ipvs0"
)

// fightAdvice ends every node.other-proxy-rules finding.
const fightAdvice = "two proxies then program the same services and their rules fight; stop kube-proxy " +
	"(remove its DaemonSet) and remove its rules: weir run with takeover on does once Weir's rules serve, as does kube-proxy --cleanup"

// otherProxies looks for kube-proxy's rules of every mode that are not
// Weir's own: Weir's iptables mode keeps kube-proxy's chain names, in the
// flavour it uses, and a configured table or interface may carry
// kube-proxy's name. It only reads.
func (c *nodeCheck) otherProxies() []Finding {
	var out []Finding
	if _, err := c.nft.tables(); err != nil {
		if c.o.Mode != "nftables" { // there, features reported it
			out = append(out, c.failed("for kube-proxy's nftables tables and iptables-nft chains", err))
		}
	} else {
		out = append(out, c.kubeProxyTables()...)
	}
	out = append(out, c.kubeProxyChains()...)
	return append(out, c.kubeProxyInterface()...)
}

// kubeProxyTables reports kube-proxy's nftables tables, unless Weir's
// nftables mode uses that name itself. The tables are listed already.
func (c *nodeCheck) kubeProxyTables() []Finding {
	if c.o.Mode == "nftables" && c.o.NFTablesTable == kubeProxyTable {
		return nil
	}
	var found []string
	for _, f := range []struct {
		fam nftables.TableFamily
		kw  string
	}{{nftables.TableFamilyIPv4, "ip"}, {nftables.TableFamilyIPv6, "ip6"}} {
		if ok, _ := c.nft.has(f.fam, kubeProxyTable); ok {
			found = append(found, f.kw+" "+kubeProxyTable)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return []Finding{nodeFinding("node.other-proxy-rules", Broken,
		"nftables %s: kube-proxy in mode nftables programs this node beside Weir, or left its rules behind; %s",
		nodeCount(found, "table %s exists", "tables %s exist"), fightAdvice)}
}

// kubeProxyChains reports kube-proxy's nat KUBE-SERVICES chain in each
// iptables flavour Weir does not use. In mode iptables with the flavour
// unknown, it can only tell when both flavours have the chain.
func (c *nodeCheck) kubeProxyChains() []Finding {
	var out []Finding
	var found []string
	for _, fl := range iptablesFlavours {
		if c.o.Mode == "iptables" && fl == c.o.IptablesFlavour {
			continue // Weir's own chain
		}
		families, err := c.natServices(fl)
		if err != nil {
			out = append(out, c.failed("for kube-proxy's iptables-"+fl+" chains", err))
		}
		if len(families) > 0 {
			found = append(found, fmt.Sprintf("iptables-%s (%s)", fl, strings.Join(families, ", ")))
		}
	}
	unknown := c.o.Mode == "iptables" && c.o.IptablesFlavour == ""
	switch {
	case unknown && len(found) == len(iptablesFlavours):
		out = append(out, nodeFinding("node.other-proxy-rules", Broken,
			"both iptables flavours have a nat chain %s, %s: one is Weir's, the other kube-proxy's, "+
				"which programs this node beside Weir or left its rules behind; %s",
			kubeProxyServices, strings.Join(found, " and "), fightAdvice))
	case !unknown && len(found) > 0:
		out = append(out, nodeFinding("node.other-proxy-rules", Broken,
			"the nat chain %s exists in %s, which Weir does not use: kube-proxy in mode iptables or ipvs "+
				"programs this node beside Weir, or left its rules behind; %s",
			kubeProxyServices, strings.Join(found, " and "), fightAdvice))
	}
	return out
}

// servicesChain returns the IP families (IPv4, IPv6) whose nat table of
// flavour fl has kubeProxyServices. It skips iptables-legacy families
// whose save tool is not installed.
func (c *nodeCheck) servicesChain(fl string) ([]string, error) {
	var found []string
	var errs []error
	for _, f := range []struct {
		name     string
		nft      nftables.TableFamily
		tables   string // the /proc/net file listing legacy tables
		saveTool string
	}{
		{"IPv4", nftables.TableFamilyIPv4, "ip_tables_names", "iptables-legacy-save"},
		{"IPv6", nftables.TableFamilyIPv6, "ip6_tables_names", "ip6tables-legacy-save"},
	} {
		var ok bool
		var err error
		if fl == "nft" {
			ok, err = c.nftServicesChain(f.nft)
		} else {
			ok, err = c.legacyServicesChain(f.tables, f.saveTool)
		}
		if ok {
			found = append(found, f.name)
		}
		errs = append(errs, err)
	}
	return found, errors.Join(errs...)
}

// nftServicesChain says whether iptables-nft's nat table of family f has
// kubeProxyServices, read over netlink: the rules are there whether or not
// this node has the binaries that wrote them (kube-proxy brings its own).
func (c *nodeCheck) nftServicesChain(f nftables.TableFamily) (bool, error) {
	if _, err := c.nft.tables(); err != nil {
		return false, nil // otherProxies reported it
	}
	return c.nft.hasChain(f, "nat", kubeProxyServices)
}

// legacyServicesChain says whether iptables-legacy's nat table, listed in
// /proc/net/<tables>, has kubeProxyServices. Only a table the kernel has
// is saved: a legacy tool reading a table creates it.
func (c *nodeCheck) legacyServicesChain(tables, saveTool string) (bool, error) {
	names, err := os.ReadFile(c.procNet(tables))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // no x_tables for the family
	}
	if err != nil || !slices.Contains(strings.Fields(string(names)), "nat") {
		return false, err
	}
	bin, err := exec.LookPath(saveTool)
	if err != nil {
		return false, nil // not installed: skipped
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(c.ctx, bin, "-t", "nat")
	cmd.Stderr = &stderr
	save, err := cmd.Output()
	if err != nil {
		return false, fmt.Errorf("%s -t nat: %w: %s", bin, err, strings.TrimSpace(stderr.String()))
	}
	return chainDeclared(save, kubeProxyServices), nil
}

// chainDeclared says whether iptables-save output declares chain.
func chainDeclared(save []byte, chain string) bool {
	for line := range bytes.Lines(save) {
		if bytes.HasPrefix(line, []byte(":"+chain+" ")) {
			return true
		}
	}
	return false
}

// kubeProxyInterface reports kube-proxy's IPVS interface, unless Weir's
// IPVS mode uses that name itself.
func (c *nodeCheck) kubeProxyInterface() []Finding {
	if c.o.Mode == "ipvs" && c.o.IPVSInterface == kubeProxyInterface {
		return nil
	}
	if _, err := os.Stat(filepath.Join(c.o.SysRoot, "class", "net", kubeProxyInterface)); err != nil {
		return nil
	}
	return []Finding{nodeFinding("node.other-proxy-rules", Broken,
		"interface %s exists: kube-proxy in mode ipvs programs this node beside Weir, or left its interface and virtual servers behind; %s",
		kubeProxyInterface, fightAdvice)}
}

// nodeCount formats items with one or many, whichever fits their number.
func nodeCount(items []string, one, many string) string {
	if len(items) == 1 {
		return fmt.Sprintf(one, items[0])
	}
	return fmt.Sprintf(many, strings.Join(items, " and "))
}
