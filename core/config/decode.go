package config

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// bad describes a rejected value: the offending text and what would be accepted.
type bad struct {
	value   string
	allowed string
}

// What each kind of key accepts, worded to follow "use" in an error message.
const (
	allowedPath        = "a non-empty folder path such as /etc/weir/manifests"
	allowedKubeconfig  = "a file path, or an empty string for the in-cluster service account"
	allowedNodeName    = "a lower-case DNS name of at most 253 characters, such as node-1 or node-1.example.com"
	allowedCIDRs       = "CIDRs such as 10.0.0.0/8 or fd00::/48, as a YAML list or comma-separated"
	allowedNodePorts   = "the single word primary or all on its own, or CIDRs such as 192.168.0.0/16 or fd00::/64, as a YAML list or comma-separated"
	allowedNoLocalhost = allowedNodePorts + "; localhost is not supported: Weir serves node ports on 127.0.0.1 only together with every local address, " +
		"with nodePortAddresses [all] and localhostNodePorts true (IPv4)"
	allowedBool        = "true or false"
	allowedPortRange   = "two ports FIRST-LAST with 1 <= FIRST <= LAST <= 65535, such as 30000-32767"
	allowedIfPrefix    = "an interface name prefix of 1 to 14 characters without spaces or slashes, such as veth or cali"
	allowedIfName      = "an interface name of 1 to 15 characters without spaces, slashes or colons, such as weir-ipvs0"
	allowedPositive    = "a duration greater than zero, such as 30s, 1m or 500ms"
	allowedNonNeg      = "a duration of zero or more, such as 1s, 500ms or 0"
	allowedNonNegInt   = "a whole number of zero or more, such as 0 or 32768"
	allowedHostPort    = "an IP address and port such as 127.0.0.1:10249, [::1]:10249, or :10249 for every address"
	allowedBindAddress = allowedHostPort + ", or empty to disable the server"
	allowedTable       = "1 to 32 letters, digits, '_' or '-', such as weir"
	allowedPlugins     = "a YAML list of mappings, one per plugin"
	allowedSection     = "a mapping with the keys "
)

var (
	tableName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	dnsName   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// scalar returns raw as text if it is a single value. YAML numbers and
// booleans are accepted as their text, so `table: 123` works.
func scalar(raw any) (string, bool) {
	switch v := raw.(type) {
	case string:
		return strings.TrimSpace(v), true
	case nil, map[string]any, []any, []string, []map[string]any:
		return "", false
	}
	return fmt.Sprint(raw), true
}

// list returns raw as a list of text items. A YAML list and a comma-separated
// string (from the environment, a flag, or YAML) are both accepted; empty
// items are dropped.
func list(raw any) ([]string, bool) {
	var items []string
	switch v := raw.(type) {
	case nil:
	case string:
		items = strings.Split(v, ",")
	case []string:
		items = v
	case []any:
		for _, e := range v {
			s, ok := scalar(e)
			if !ok {
				return nil, false
			}
			items = append(items, s)
		}
	default:
		return nil, false
	}
	var out []string
	for _, s := range items {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out, true
}

// show renders a raw value for an error message or a flag default: text as
// is, a comma-separated list as given, and YAML collections in flow style.
func show(raw any) string {
	switch v := raw.(type) {
	case nil:
		return ""
	case string:
		return v
	case []string:
		return strings.Join(v, ",")
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = show(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		parts := make([]string, 0, len(v))
		for _, k := range slices.Sorted(maps.Keys(v)) {
			parts = append(parts, k+": "+show(v[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(raw)
}

func stringKey(dst func(*Config) *string, allowed string, ok func(string) bool) func(*Config, any) *bad {
	return func(c *Config, raw any) *bad {
		s, isScalar := scalar(raw)
		if !isScalar || !ok(s) {
			return &bad{show(raw), allowed}
		}
		*dst(c) = s
		return nil
	}
}

// enumKey sets a key that takes one of values.
func enumKey[T ~string](dst func(*Config) *T, values ...T) func(*Config, any) *bad {
	allowed := "one of " + strings.Join(texts(values), ", ")
	return func(c *Config, raw any) *bad {
		s, ok := scalar(raw)
		if !ok || !slices.Contains(values, T(s)) {
			return &bad{show(raw), allowed}
		}
		*dst(c) = T(s)
		return nil
	}
}

// texts returns values as plain strings.
func texts[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// orList writes values as "a, b or c".
func orList[T ~string](values []T) string {
	s := texts(values)
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func nonEmpty(s string) bool { return s != "" }

// isIfPrefix accepts what can start a Linux interface name, or nothing.
func isIfPrefix(s string) bool {
	return s == "" || (len(s) <= 14 && !strings.ContainsAny(s, " /\t\n:"))
}

// isIfName accepts a Linux interface name: 1 to 15 bytes (IFNAMSIZ less
// the NUL), not "." or "..", without '/', whitespace or ':' (alias syntax).
func isIfName(s string) bool {
	return s != "" && len(s) <= 15 && s != "." && s != ".." && !strings.ContainsAny(s, " /\t\n:")
}

func anyString(string) bool { return true }

func isTableName(s string) bool { return tableName.MatchString(s) }

// isBindAddress accepts a server's IP:port, or nothing to disable it.
func isBindAddress(s string) bool { return s == "" || isHostPort(s) }

// isHostPort reports whether s is IP:port or :port, with a port from 0 to
// 65535 (0 picks a free port, which tests use).
func isHostPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return false
		}
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// setNodeName lower-cases the name, like kube-proxy's --hostname-override,
// and requires a DNS subdomain, which is what a Node's name must be.
func setNodeName(c *Config, raw any) *bad {
	s, ok := scalar(raw)
	s = strings.ToLower(s)
	if !ok || len(s) > 253 || !dnsName.MatchString(s) {
		return &bad{show(raw), allowedNodeName}
	}
	c.NodeName = s
	return nil
}

func boolKey(dst func(*Config) *bool) func(*Config, any) *bad {
	return func(c *Config, raw any) *bad {
		if b, ok := raw.(bool); ok {
			*dst(c) = b
			return nil
		}
		s, _ := scalar(raw)
		b, err := strconv.ParseBool(s)
		if err != nil {
			return &bad{show(raw), allowedBool}
		}
		*dst(c) = b
		return nil
	}
}

// durationKey accepts Go durations such as "30s" or "1m30s"; a bare number
// is rejected (its unit would be a guess), except 0.
// intKey sets a non-negative integer.
func intKey(dst func(*Config) *int) func(*Config, any) *bad {
	return func(c *Config, raw any) *bad {
		s, ok := scalar(raw)
		n, err := strconv.Atoi(s)
		if !ok || err != nil || n < 0 {
			return &bad{show(raw), allowedNonNegInt}
		}
		*dst(c) = n
		return nil
	}
}

func durationKey(dst func(*Config) *time.Duration, positive bool) func(*Config, any) *bad {
	allowed := allowedNonNeg
	if positive {
		allowed = allowedPositive
	}
	return func(c *Config, raw any) *bad {
		s, ok := scalar(raw)
		d, err := time.ParseDuration(s)
		if !ok || err != nil || d < 0 || (positive && d == 0) {
			return &bad{show(raw), allowed}
		}
		*dst(c) = d
		return nil
	}
}

// parsePrefixes parses CIDRs, clearing any host bits ("10.1.2.3/8" is
// 10.0.0.0/8). It returns nil for an empty list, and the first bad item.
func parsePrefixes(items []string) ([]netip.Prefix, string, bool) {
	var out []netip.Prefix
	for _, s := range items {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, s, false
		}
		out = append(out, p.Masked())
	}
	return out, "", true
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func cidrsKey(dst func(*Config) *[]netip.Prefix) func(*Config, any) *bad {
	return func(c *Config, raw any) *bad {
		items, ok := list(raw)
		if !ok {
			return &bad{show(raw), allowedCIDRs}
		}
		ps, item, ok := parsePrefixes(items)
		if !ok {
			return &bad{item, allowedCIDRs}
		}
		*dst(c) = ps
		return nil
	}
}

// The keywords nodePortAddresses takes besides CIDRs, as kube-proxy's
// --nodeport-addresses does.
const (
	nodePortsPrimary   = "primary"
	nodePortsAll       = "all"
	nodePortsLocalhost = "localhost"
)

// getNodePortAddresses renders the value so that it loads back as itself:
// every local address is the keyword all, since an empty list takes the
// mode's default.
func getNodePortAddresses(c *Config) any {
	switch {
	case c.NodePortAddresses.Primary:
		return []string{nodePortsPrimary}
	case len(c.NodePortAddresses.CIDRs) == 0:
		return []string{nodePortsAll}
	}
	return prefixStrings(c.NodePortAddresses.CIDRs)
}

// setNodePortAddresses accepts the keyword primary or all on its own, or
// CIDRs. kube-proxy's localhost keyword is refused by name: Weir serves
// node ports on loopback only alongside every local address, with
// localhostNodePorts.
func setNodePortAddresses(c *Config, raw any) *bad {
	items, ok := list(raw)
	if !ok {
		return &bad{show(raw), allowedNodePorts}
	}
	switch {
	case slices.Contains(items, nodePortsLocalhost):
		return &bad{show(raw), allowedNoLocalhost}
	case len(items) == 1 && items[0] == nodePortsPrimary:
		c.NodePortAddresses = NodePortAddresses{Primary: true}
		return nil
	case len(items) == 1 && items[0] == nodePortsAll:
		c.NodePortAddresses = NodePortAddresses{}
		return nil
	case slices.Contains(items, nodePortsPrimary) || slices.Contains(items, nodePortsAll):
		return &bad{show(raw), allowedNodePorts}
	}
	ps, item, ok := parsePrefixes(items)
	if !ok {
		return &bad{item, allowedNodePorts}
	}
	c.NodePortAddresses = NodePortAddresses{CIDRs: ps}
	return nil
}

// defaultNodePortAddresses sets kube-proxy's default for c.Mode: the
// node's primary IPs in mode nftables, every local address in modes
// iptables and ipvs.
func defaultNodePortAddresses(c *Config) {
	c.NodePortAddresses = NodePortAddresses{Primary: c.Mode == "nftables"}
}

// defaultLocalhostNodePorts sets kube-proxy's default for c.Mode: on in
// mode iptables (and in mode ipvs, which ignores it), off in mode
// nftables, whose kube-proxy never serves node ports on loopback.
func defaultLocalhostNodePorts(c *Config) {
	c.LocalhostNodePorts = c.Mode != "nftables"
}

// isUnset reports whether raw, the merged value of f, leaves f at its
// mode's default: no layer set it, or f is a list set to an empty list.
func isUnset(f *field, raw any) bool {
	if raw == nil {
		return true
	}
	items, ok := list(raw)
	return f.typ == "cidrs" && ok && len(items) == 0
}

// setPortRange accepts "FIRST-LAST", as the API server's
// --service-node-port-range does.
func setPortRange(c *Config, raw any) *bad {
	s, ok := scalar(raw)
	first, last, found := strings.Cut(strings.TrimSpace(s), "-")
	if !ok || !found {
		return &bad{show(raw), allowedPortRange}
	}
	f, err1 := strconv.ParseUint(strings.TrimSpace(first), 10, 16)
	l, err2 := strconv.ParseUint(strings.TrimSpace(last), 10, 16)
	if err1 != nil || err2 != nil || f < 1 || f > l {
		return &bad{show(raw), allowedPortRange}
	}
	c.NodePortRange = PortRange{First: uint16(f), Last: uint16(l)}
	return nil
}

func getPlugins(c *Config) any {
	if len(c.pluginEntries) == 0 {
		return nil // no typed nil: the defaults layer then leaves the key unset
	}
	return c.pluginEntries
}

// setPlugins keeps the plugin entries as written; decodePlugins checks each
// one, so that errors can name the entry and its key.
func setPlugins(c *Config, raw any) *bad {
	var out []map[string]any
	switch v := raw.(type) {
	case nil:
	case []map[string]any:
		out = append(out, v...)
	case []any:
		for _, e := range v {
			m, ok := e.(map[string]any)
			if !ok {
				return &bad{show(raw), allowedPlugins}
			}
			out = append(out, m)
		}
	default:
		return &bad{show(raw), allowedPlugins}
	}
	c.pluginEntries = out
	return nil
}
