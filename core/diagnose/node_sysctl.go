package diagnose

import (
	"errors"
	"path/filepath"
	"strings"
)

// forwarding checks that the node routes packets between interfaces, for
// IPv6 too on a dual-stack node.
func (c *nodeCheck) forwarding() []Finding {
	out := c.mustBeOn("net.ipv4.ip_forward", "node.ip-forward-off", Broken,
		"this node does not forward packets, so connections to services whose endpoints run on other nodes or in pods are dropped")
	if c.o.DualStack {
		out = append(out, c.mustBeOn("net.ipv6.conf.all.forwarding", "node.ipv6-forward-off", Broken,
			"this node does not forward IPv6 packets, so IPv6 connections to services whose endpoints run on other nodes or in pods are dropped")...)
	}
	return out
}

// routeLocalnet checks, when Weir serves node ports on 127.0.0.1, that the
// kernel routes packets to loopback addresses to the pods they are
// translated to. Mode ipvs serves no node ports on loopback.
func (c *nodeCheck) routeLocalnet() []Finding {
	if !c.o.LocalhostNodePorts || c.o.Mode == "ipvs" {
		return nil
	}
	return c.mustBeOn("net.ipv4.conf.all.route_localnet", "node.route-localnet-off", Warning,
		"NodePorts on 127.0.0.1 do not answer although localhostNodePorts is on "+
			"(weir run sets it at its first sync in modes nftables and iptables, so it has not synced in this network namespace yet, "+
			"or could not write the sysctl and logged why)")
}

// mustBeOn returns a finding when the sysctl key is 0: what that breaks
// (why) and how to turn it on.
func (c *nodeCheck) mustBeOn(key, code string, sev Severity, why string) []Finding {
	v, err := c.sysctlInt(key)
	switch {
	case err != nil:
		return []Finding{c.failed(key, err)}
	case v == 0:
		return []Finding{nodeFinding(code, sev, "%s is 0: %s; set it to 1 (sysctl -w %s=1)", key, why, key)}
	}
	return nil
}

// bridgeNF checks, when the namespace has a bridge, that bridged packets
// go through netfilter (br_netfilter with bridge-nf-call-iptables on), for
// IPv6 too on a dual-stack node.
func (c *nodeCheck) bridgeNF() []Finding {
	bridges, err := c.bridges()
	if err != nil || len(bridges) == 0 {
		return nil // a glob fails only on a bad pattern
	}
	keys := []string{"net.bridge.bridge-nf-call-iptables"}
	codes := []string{"node.bridge-nf-call-iptables-off"}
	if c.o.DualStack {
		keys = append(keys, "net.bridge.bridge-nf-call-ip6tables")
		codes = append(codes, "node.bridge-nf-call-ip6tables-off")
	}
	const why = "packets bridged between pods skip netfilter, so when a pod connects to a service whose chosen endpoint " +
		"is a pod on the same bridge, the reply goes straight back over the bridge without conntrack undoing the DNAT, " +
		"and the client drops it as coming from an address it never connected to"
	exist := nodeCount(bridges, "bridge %s exists", "bridges %s exist")
	var out []Finding
	for i, key := range keys {
		v, err := c.sysctlInt(key)
		switch {
		case errors.Is(err, errNoFile):
			return []Finding{nodeFinding(codes[0], Warning,
				"%s but the br_netfilter module is not loaded (there is no %s): %s; "+
					"load it (modprobe br_netfilter) and set %s to 1", exist, key, why, strings.Join(keys, " and "))}
		case err != nil:
			out = append(out, c.failed(key, err))
		case v == 0:
			out = append(out, nodeFinding(codes[i], Warning, "%s and %s is 0: %s; set it to 1 (sysctl -w %s=1)",
				exist, key, why, key))
		}
	}
	return out
}

// bridges returns the names of the bridge interfaces sysfs lists.
func (c *nodeCheck) bridges() ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(c.o.SysRoot, "class", "net", "*", "bridge"))
	names := make([]string, len(dirs))
	for i, d := range dirs {
		names[i] = filepath.Base(filepath.Dir(d))
	}
	return names, err
}

// rpFilter checks that reverse-path filtering is not strict for every
// interface.
func (c *nodeCheck) rpFilter() []Finding {
	const key = "net.ipv4.conf.all.rp_filter"
	v, err := c.sysctlInt(key)
	switch {
	case err != nil:
		return []Finding{c.failed(key, err)}
	case v == 1:
		return []Finding{nodeFinding("node.rp-filter-strict", Warning,
			"%s is 1 (strict), and the kernel applies the higher of it and each interface's own value, so every interface "+
				"drops packets whose source it would not itself route back to: asymmetric paths (several interfaces, tunnels, "+
				"some CNI plugins) lose service traffic; set it to 2, loose (sysctl -w %s=2)", key, key)}
	}
	return nil
}

// conntrack checks how full the connection-tracking table is.
func (c *nodeCheck) conntrack() []Finding {
	count, err := c.sysctlInt("net.netfilter.nf_conntrack_count")
	var limit int64
	if err == nil {
		limit, err = c.sysctlInt("net.netfilter.nf_conntrack_max")
	}
	switch {
	case errors.Is(err, errNoFile):
		return []Finding{nodeFinding("node.conntrack-missing", Warning,
			"conntrack is not available in this network namespace (%v): the nf_conntrack module is not loaded yet "+
				"(NAT rules load it), so the table's size and use cannot be checked", err)}
	case err != nil:
		return []Finding{c.failed("the conntrack table", err)}
	case limit <= 0:
		return []Finding{nodeFinding("node.conntrack-usage", Info, "conntrack table: %d entries, no limit", count)}
	case count >= limit:
		return []Finding{nodeFinding("node.conntrack-full", Broken,
			"the conntrack table is full (%d of %d entries): the kernel drops the first packet of every new connection "+
				"(dmesg: \"nf_conntrack: table full, dropping packet\"); raise net.netfilter.nf_conntrack_max "+
				"(conntrack.maxPerCore and conntrack.min in Weir's config), or find what opens so many connections", count, limit)}
	case count*10 >= limit*9:
		return []Finding{nodeFinding("node.conntrack-nearly-full", Warning,
			"the conntrack table is %d%% full (%d of %d entries): once full, the kernel drops the first packet of every new connection; "+
				"raise net.netfilter.nf_conntrack_max (conntrack.maxPerCore and conntrack.min in Weir's config)", count*100/limit, count, limit)}
	}
	return []Finding{nodeFinding("node.conntrack-usage", Info, "conntrack table: %d of %d entries in use (%d%%)", count, limit, count*100/limit)}
}
