package config

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/weirproxy/weir/backends"
)

// kube-proxy's own configuration file, KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1, as kubeadm writes it into the
// kube-proxy ConfigMap), is read in place of Weir's: fromKubeProxy maps each
// field Weir implements onto Weir's key, refuses a field Weir does not
// implement that is set to something other than kube-proxy's default, and
// warns about one that does not matter on Weir. kubeadm writes every field,
// most at their zero value (null, "", 0, false, 0s), which means "kube-proxy's
// default".

const (
	kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyKind       = "KubeProxyConfiguration"
)

// isKubeProxyConfig reports whether a decoded YAML file is a
// KubeProxyConfiguration.
func isKubeProxyConfig(raw map[string]any) bool {
	return raw["kind"] == kubeProxyKind
}

// kubeProxy converts one KubeProxyConfiguration.
type kubeProxy struct {
	raw      map[string]any
	out      map[string]any // Weir's keys, nested like its YAML
	mode     string         // Weir's mode
	errs     []string       // fields refused: "field: why"
	warnings []string
	used     map[string]bool // fields read
}

// fromKubeProxy returns the Weir configuration equivalent to raw, the
// fields it refuses (each "field: why") and warnings about those it ignores.
func fromKubeProxy(raw map[string]any) (out map[string]any, refused, warnings []string) {
	k := &kubeProxy{raw: raw, out: map[string]any{}, used: map[string]bool{"kind": true, "apiVersion": true}}
	if v := k.str("apiVersion"); v != kubeProxyAPIVersion {
		k.refuse("apiVersion", fmt.Sprintf("%q is not supported; Weir reads %s", v, kubeProxyAPIVersion))
	}
	k.convertMode()
	k.convertSource()
	k.convertAddresses()
	k.convertModeSections()
	k.convertConntrack()
	k.convertLogging()
	k.ignored()
	k.unknown(raw, "")
	return k.out, k.errs, k.warnings
}

// get returns the value at a dotted path of raw, marking it read.
func (k *kubeProxy) get(path string) any {
	k.used[path] = true
	var cur any = k.raw
	for part := range strings.SplitSeq(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[part]
	}
	return cur
}

func (k *kubeProxy) str(path string) string {
	v := k.get(path)
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// zero reports whether v is absent or a zero value: kube-proxy's default.
func zero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		if x == "" {
			return true
		}
		d, err := time.ParseDuration(x)
		return err == nil && d == 0
	case bool:
		return !x
	case int:
		return x == 0
	case int64:
		return x == 0
	case float64:
		return x == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		for _, e := range x {
			if !zero(e) {
				return false
			}
		}
		return true
	}
	return false
}

// set puts value at Weir's dotted key.
func (k *kubeProxy) set(key string, value any) {
	m := k.out
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = value
}

// setIf copies the kube-proxy field at path to Weir's key when it is set.
func (k *kubeProxy) setIf(path, key string) {
	if v := k.get(path); !zero(v) {
		k.set(key, v)
	}
}

func (k *kubeProxy) refuse(path, why string) { k.errs = append(k.errs, path+": "+why) }

func (k *kubeProxy) warn(path, why string) { k.warnings = append(k.warnings, path+": "+why) }

// convertMode maps mode: kube-proxy's default on Linux is iptables.
func (k *kubeProxy) convertMode() {
	switch m := k.str("mode"); m {
	case "", "iptables":
		k.mode = "iptables"
	case "ipvs", "nftables":
		k.mode = m
	default:
		k.refuse("mode", fmt.Sprintf("%q is not a mode Weir has (iptables, ipvs, nftables)", m))
		return
	}
	k.set("mode", k.mode)
}

// convertSource points the kubernetes source at kube-proxy's kubeconfig.
func (k *kubeProxy) convertSource() {
	k.set("source.kind", "kubernetes")
	k.setIf("clientConnection.kubeconfig", "source.kubeconfig")
	for _, f := range []string{"clientConnection.acceptContentTypes", "clientConnection.contentType",
		"clientConnection.qps", "clientConnection.burst"} {
		if !zero(k.get(f)) {
			k.warn(f, "ignored: Weir's client sends protobuf and paces itself")
		}
	}
	k.setIf("hostnameOverride", "nodeName")
	if v := k.str("clusterCIDR"); v != "" {
		k.set("clusterCIDRs", v)
	}
}

// convertAddresses maps the bind addresses and nodePortAddresses.
func (k *kubeProxy) convertAddresses() {
	for _, a := range []struct{ field, key, port string }{
		{"healthzBindAddress", "healthzBindAddress", "10256"},
		{"metricsBindAddress", "metricsBindAddress", "10249"},
	} {
		if v := k.str(a.field); v != "" {
			k.set(a.key, withPort(v, a.port))
		}
	}
	if v := k.str("bindAddress"); v != "" && v != "0.0.0.0" && v != "::" {
		k.refuse("bindAddress", fmt.Sprintf("%q: Weir takes the node's IPs from its Node object, not from bindAddress", v))
	}
	if k.get("bindAddressHardFail") == true {
		k.warn("bindAddressHardFail", "ignored: Weir always fails when it cannot serve a bind address")
	}
	k.convertNodePorts()
	k.setIf("enableProfiling", "enableProfiling")
	switch m := k.str("detectLocalMode"); {
	case m == "":
	case slices.Contains(backends.LocalDetectors, backends.LocalDetector(m)):
		k.set("localDetector.mode", m)
	default:
		k.refuse("detectLocalMode", fmt.Sprintf("%q is not implemented by Weir (%s)", m,
			strings.Join(texts(backends.LocalDetectors), ", ")))
	}
	k.setIf("detectLocal.interfaceNamePrefix", "localDetector.interfaceNamePrefix")
	if !zero(k.get("detectLocal.bridgeInterface")) {
		k.refuse("detectLocal.bridgeInterface", "local detection by bridge interface is not implemented by Weir")
	}
}

// convertNodePorts writes out, explicitly, where kube-proxy serves node
// ports in its mode, so the result does not rest on Weir's defaults:
// nodePortAddresses as given (its keywords are Weir's too), or when unset
// kube-proxy's default for the mode (primary in nftables, all
// elsewhere); and localhostNodePorts, which kube-proxy applies in
// iptables mode only (default true) and never does in nftables mode.
func (k *kubeProxy) convertNodePorts() {
	if v := k.get("nodePortAddresses"); !zero(v) {
		k.set("nodePortAddresses", v)
	} else if k.mode != "" {
		def := &Config{Mode: k.mode}
		defaultNodePortAddresses(def)
		k.set("nodePortAddresses", getNodePortAddresses(def))
	}
	v := k.get("iptables.localhostNodePorts")
	switch k.mode {
	case "iptables":
		if v == nil {
			v = true
		}
		k.set("localhostNodePorts", v)
	case "nftables":
		k.set("localhostNodePorts", false)
	}
	if k.mode != "iptables" && k.mode != "" && !zero(v) {
		k.warn("iptables.localhostNodePorts", "ignored: kube-proxy applies it in iptables mode only")
	}
}

// withPort adds kube-proxy's default port to a bind address that has none.
func withPort(addr, port string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), port)
}

// convertModeSections reads the iptables, nftables and ipvs sections: the
// sync periods and masqueradeAll of the mode in use (ipvs mode takes
// masqueradeAll from iptables, like kube-proxy), and the ipvs settings.
func (k *kubeProxy) convertModeSections() {
	periods, masq := k.mode, k.mode
	if k.mode == "ipvs" {
		masq = "iptables"
	}
	k.setIf(periods+".syncPeriod", "syncPeriod")
	k.setIf(periods+".minSyncPeriod", "minSyncPeriod")
	k.setIf(masq+".masqueradeAll", "masqueradeAll")
	for _, s := range []string{"iptables", "nftables", "ipvs"} {
		if s != periods {
			k.get(s + ".syncPeriod")
			k.get(s + ".minSyncPeriod")
		}
		if s != masq && s != "ipvs" {
			k.get(s + ".masqueradeAll")
		}
	}
	for _, s := range []string{"iptables", "nftables"} {
		if v := k.get(s + ".masqueradeBit"); !zero(v) && fmt.Sprint(v) != "14" && (s == masq || s == k.mode) {
			k.refuse(s+".masqueradeBit", fmt.Sprintf("%v: Weir marks packets for masquerade with bit 14 (0x4000) only", v))
		}
	}
	k.setIf("ipvs.scheduler", "ipvs.scheduler")
	k.setIf("ipvs.strictARP", "ipvs.strictARP")
	for _, f := range []string{"ipvs.excludeCIDRs", "ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout"} {
		if v := k.get(f); !zero(v) && k.mode == "ipvs" {
			k.refuse(f, fmt.Sprintf("%v: not implemented by Weir's ipvs mode", v))
		}
	}
}

// convertConntrack copies the conntrack section. A null field keeps
// kube-proxy's default, which is Weir's too; an explicit 0 of maxPerCore or
// of a TCP timeout (whose defaults are not 0) leaves the kernel's value.
func (k *kubeProxy) convertConntrack() {
	for _, f := range []string{"maxPerCore", "min", "tcpEstablishedTimeout", "tcpCloseWaitTimeout"} {
		if v := k.get("conntrack." + f); v != nil {
			k.set("conntrack."+f, v)
		}
	}
	for _, f := range []string{"tcpBeLiberal", "udpTimeout", "udpStreamTimeout"} {
		k.setIf("conntrack."+f, "conntrack."+f)
	}
}

// convertLogging maps the logging format and a verbosity of 4 or more
// (kube-proxy's debug logs) to Weir's log keys.
func (k *kubeProxy) convertLogging() {
	if f := k.str("logging.format"); f == "json" {
		k.set("log.format", "json")
	}
	if n, err := strconv.Atoi(k.str("logging.verbosity")); err == nil && n >= 4 {
		k.set("log.level", "debug")
	}
	for _, f := range []string{"logging.flushFrequency", "logging.options", "logging.vmodule"} {
		k.get(f)
	}
}

// ignored reads the fields that do not matter on Weir, warning about those
// set to something else than their default.
func (k *kubeProxy) ignored() {
	why := map[string]string{
		"showHiddenMetricsForVersion": "Weir has no hidden metrics",
		"portRange":                   "kube-proxy ignores it too since the userspace mode went",
		"oomScoreAdj":                 "set it in the DaemonSet's pod spec",
		"featureGates":                "Weir has no feature gates",
		"configSyncPeriod":            "Weir's informers do not resync",
		"winkernel":                   "Windows only",
		"windowsRunAsService":         "Windows only",
	}
	for _, f := range slices.Sorted(maps.Keys(why)) {
		if !zero(k.get(f)) && (f != "configSyncPeriod" || k.str(f) != "15m0s") {
			k.warn(f, "ignored: "+why[f])
		}
	}
}

// unknown refuses every field of m under prefix that no conversion read.
func (k *kubeProxy) unknown(m map[string]any, prefix string) {
	for _, name := range slices.Sorted(maps.Keys(m)) {
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if k.used[path] {
			continue
		}
		if sub, ok := m[name].(map[string]any); ok {
			k.unknown(sub, path)
			continue
		}
		k.refuse(path, "not a KubeProxyConfiguration field Weir knows")
	}
}

// ConvertKubeProxy reads the KubeProxyConfiguration file at path and
// returns the equivalent Weir configuration as YAML (only the keys it
// sets), with warnings about the fields Weir ignores. A field Weir refuses,
// or a value Weir's keys do not accept, is an error, as Load would report
// it.
func ConvertKubeProxy(path string) ([]byte, []string, error) {
	src := "file " + path
	fk := koanf.New(".")
	if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
		return nil, nil, &Error{Value: path, Source: src, kind: kindMalformed, err: err}
	}
	raw := fk.Raw()
	if !isKubeProxyConfig(raw) {
		return nil, nil, fmt.Errorf("config: %s is not a %s (kind %v)", src, kubeProxyKind, raw["kind"])
	}
	l := newLoader()
	if err := l.loadDefaults(); err != nil {
		return nil, nil, err
	}
	out := l.fromKubeProxy(raw, src)
	clean := l.checkKeys(out, "", src)
	lk := koanf.New(".")
	if err := lk.Load(confmap.Provider(clean, ""), nil); err != nil {
		return nil, nil, &Error{Value: path, Source: src, kind: kindMalformed, err: err}
	}
	if err := l.merge(lk, func(*field) string { return src }); err != nil {
		return nil, nil, err
	}
	l.decode()
	if len(l.errs) > 0 {
		return nil, l.warnings, joinErrors(l.errs)
	}
	text, err := lk.Marshal(yaml.Parser())
	return text, l.warnings, err
}
