package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/v2"
)

// FuzzLoad loads the fuzz bytes as Weir's YAML file (which may also be a
// KubeProxyConfiguration) and checks that loading cannot panic, that the
// same file loads the same way twice, that a loaded configuration passes
// every key's own check again with the same value, and that a failure is
// made of *Error values, each naming its key or file and where it came
// from.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"", "mode: ipvs\n", "mode: [nftables\n", "- mode\n", "colour: blue\nmode: x\n",
		"syncPeriod: 1s\nminSyncPeriod: 2s\n",
		"localDetector: {mode: InterfaceNamePrefix, interfaceNamePrefix: veth}\n", "localDetector: {mode: InterfaceNamePrefix}\n",
		"nodeName: Node-1.Example.com\nsource: {kind: kubernetes, kubeconfig: ''}\n",
		"nodePortAddresses: [primary]\nclusterCIDRs: 10.0.0.1/8,fd00::/48\nnodePortRange: 30000-32767\n",
		"mode: iptables\nnodePortAddresses: all\nlocalhostNodePorts: false\n", "localhostNodePorts: true\nnodePortAddresses: []\n",
		"plugins:\n- name: canary\n  path: /p/canary.wasm\n  timeout: 50ms\n  memoryLimit: 16Mi\n  match: {namespaces: [shop], selector: app=web}\n",
		"plugins:\n- {name: a, path: x}\n- {name: a, path: y, sha256: 0000}\n",
		"conntrack: {maxPerCore: 0, min: 1, tcpEstablishedTimeout: 0}\nipvs: {scheduler: mh, interface: weir-ipvs0}\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := writeFuzzFile(t, dir, "weir.yaml", data)
		c, err := loadFile(path)
		again, errAgain := loadFile(path)
		if fmt.Sprint(err) != fmt.Sprint(errAgain) || !sameConfig(c, again) {
			t.Fatalf("loading twice gave\n%#v, %v\nthen\n%#v, %v", c, err, again, errAgain)
		}
		if err != nil {
			checkLoadError(t, err)
			return
		}
		checkLoaded(t, c)
	})
}

// FuzzKubeProxy reads the fuzz bytes as a KubeProxyConfiguration: Load and
// ConvertKubeProxy must agree on whether it is acceptable, with the same
// errors and warnings, and Weir's configuration ConvertKubeProxy writes
// must load to the configuration Load read from the original.
func FuzzKubeProxy(f *testing.F) {
	kubeadm, err := os.ReadFile("testdata/kubeadm-kube-proxy.conf")
	if err != nil {
		f.Fatal(err)
	}
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	f.Add(kubeadm)
	for _, s := range []string{
		"", "mode: ipvs\nipvs: {scheduler: wrr, strictARP: true, tcpTimeout: 5s}\niptables: {masqueradeAll: true}\n",
		"hostnameOverride: Node-1\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\nhealthzBindAddress: 0.0.0.0\nmetricsBindAddress: '[::1]'\n",
		"detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth, bridgeInterface: br0}\n",
		"mode: userspace\nbindAddress: 10.0.0.1\nfeatureGates: {A: true}\nlogging: {format: json, verbosity: 4}\n",
		"conntrack: {maxPerCore: 0, min: null, udpTimeout: 30s}\nnftables: {syncPeriod: 1s, minSyncPeriod: 2s, masqueradeBit: 13}\n",
		"mode: nftables\nnftables: {syncPeriod: 1s, minSyncPeriod: 2s}\nhostnameOverride: node_1\n",
		"clientConnection: {qps: 5}\nenableProfiling: true\nconfigSyncPeriod: 15m0s\n",
		"mode: nftables\nnodePortAddresses: [all]\niptables: {localhostNodePorts: true}\n", "nodePortAddresses: [localhost, 127.0.0.0/8]\n",
	} {
		f.Add([]byte(head + s))
	}
	f.Add([]byte("apiVersion: v1\nkind: KubeProxyConfiguration\nwinkernel: {enableDSR: true}\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := writeFuzzFile(t, dir, "kube-proxy.conf", data)
		c, errLoad := loadFile(path)
		text, warnings, errConvert := ConvertKubeProxy(path)
		var e *Error
		if errConvert != nil && !errors.As(errConvert, &e) {
			return // not a KubeProxyConfiguration: FuzzLoad covers it
		}
		if fmt.Sprint(errLoad) != fmt.Sprint(errConvert) {
			t.Fatalf("Load and ConvertKubeProxy disagree:\n%v\n%v", errLoad, errConvert)
		}
		if errLoad != nil {
			checkLoadError(t, errLoad)
			return
		}
		if fmt.Sprint(warnings) != fmt.Sprint(c.Warnings) {
			t.Fatalf("ConvertKubeProxy warns %q, Load %q", warnings, c.Warnings)
		}
		converted, err := loadFile(writeFuzzFile(t, dir, "weir.yaml", text))
		if err != nil {
			t.Fatalf("the converted configuration does not load: %v\n%s", err, text)
		}
		converted.Warnings = c.Warnings
		if !sameConfig(converted, c) {
			t.Fatalf("the converted configuration\n%s loads as\n%#v, the original as\n%#v", text, converted, c)
		}
	})
}

// writeFuzzFile writes data to the file name in dir and returns its path.
func writeFuzzFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadFile loads the configuration file at path, with no environment and
// no flags.
func loadFile(path string) (*Config, error) {
	return Load(nil, []string{configEnv + "=" + path})
}

// checkLoaded checks that every key of c, rendered as the defaults layer
// renders it, passes the key's check again and decodes to the same value,
// and that c, given as the only layer over the defaults, loads without an
// error to c again: a loaded configuration passes every check, those
// between keys and on plugins included.
func checkLoaded(t *testing.T, c *Config) {
	t.Helper()
	fresh := &Config{}
	for i := range fields {
		f := &fields[i]
		raw := f.get(c)
		if b := f.set(fresh, raw); b != nil {
			t.Fatalf("loaded %s %q fails its own check: %q", f.key, b.value, b.allowed)
		}
		if again := f.get(fresh); fmt.Sprintf("%#v", again) != fmt.Sprintf("%#v", raw) {
			t.Fatalf("loaded %s %#v decodes again as %#v", f.key, raw, again)
		}
	}
	if why := brokenRule(c); why != "" {
		t.Fatalf("the loaded configuration breaks a rule: %s\n%#v", why, c)
	}
	again, errs := reload(c)
	if len(errs) > 0 {
		t.Fatalf("the loaded configuration fails to load again: %v", joinErrors(errs))
	}
	again.Warnings = c.Warnings
	again.Ineffective = c.Ineffective // every key is explicit in the reload
	if !sameConfig(again, c) {
		t.Fatalf("the loaded configuration\n%#v loads again as\n%#v", c, again)
	}
}

// brokenRule returns which rule Config documents, checked here on its own,
// c breaks, or "".
func brokenRule(c *Config) string {
	names := map[string]bool{}
	for _, p := range c.Plugins {
		if names[p.Name] || p.Name == "" {
			return fmt.Sprintf("plugin name %q is empty or repeated", p.Name)
		}
		names[p.Name] = true
	}
	switch {
	case c.Mode != "nftables" && c.Mode != "iptables" && c.Mode != "ipvs":
		return "mode " + c.Mode
	case c.NodeName == "" || c.NodeName != strings.ToLower(c.NodeName) || len(c.NodeName) > 253:
		return "node name " + c.NodeName
	case c.SyncPeriod <= 0 || c.MinSyncPeriod < 0 || c.MinSyncPeriod > c.SyncPeriod:
		return fmt.Sprintf("sync periods %s and %s", c.SyncPeriod, c.MinSyncPeriod)
	case c.NodePortRange.First < 1 || c.NodePortRange.First > c.NodePortRange.Last:
		return "node port range " + c.NodePortRange.String()
	case c.NFTables.Table == "" || len(c.NFTables.Table) > 32 || c.IPVS.Interface == "" || len(c.IPVS.Interface) > 15:
		return fmt.Sprintf("table %q or interface %q", c.NFTables.Table, c.IPVS.Interface)
	case string(c.LocalDetector.Mode) == "InterfaceNamePrefix" && c.LocalDetector.InterfaceNamePrefix == "":
		return "local detection by interface name prefix without a prefix"
	case c.NodePortAddresses.Primary && len(c.NodePortAddresses.CIDRs) > 0:
		return "node port addresses both primary and CIDRs"
	case c.Conntrack.MaxPerCore < 0 || c.Conntrack.Min < 0 || c.IPVS.GracePeriod <= 0:
		return "negative conntrack size or no IPVS grace period"
	}
	for _, p := range slices.Concat(c.ClusterCIDRs, c.ServiceCIDRs, c.NodePortAddresses.CIDRs) {
		if p != p.Masked() {
			return "CIDR " + p.String() + " has host bits"
		}
	}
	return ""
}

// reload decodes c's keys as one layer over the defaults and returns the
// configuration and the errors.
func reload(c *Config) (*Config, []error) {
	l := newLoader()
	if err := l.loadDefaults(); err != nil {
		return nil, []error{err}
	}
	values := map[string]any{}
	for i := range fields {
		if v := fields[i].get(c); v != nil {
			values[fields[i].key] = v
		}
	}
	lk := koanf.New(".")
	if err := lk.Load(confmap.Provider(values, "."), nil); err != nil {
		return nil, []error{err}
	}
	if err := l.merge(lk, func(*field) string { return "the loaded configuration" }); err != nil {
		return nil, []error{err}
	}
	return l.decode(), l.errs
}

// sameConfig reports whether a and b hold the same values. Printed in Go
// syntax, they are also the same when they hold a NaN (a YAML .nan in a
// plugin's config), which is never equal to itself.
func sameConfig(a, b *Config) bool {
	return reflect.DeepEqual(a, b) || fmt.Sprintf("%#v", a) == fmt.Sprintf("%#v", b)
}

// checkLoadError checks that err is an *Error or a join of them, each with
// a message that names its key (or file) and its source.
func checkLoadError(t *testing.T, err error) {
	t.Helper()
	leaves := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // Load joins with errors.Join
		leaves = joined.Unwrap()
	}
	for _, leaf := range leaves {
		e, ok := leaf.(*Error) //nolint:errorlint // each part must be an *Error itself
		if !ok {
			t.Fatalf("error %v (%T) is not an *Error", leaf, leaf)
		}
		msg := e.Error()
		if why := errorGap(e, msg); why != "" {
			t.Fatalf("error %q %s (%+v)", msg, why, e)
		}
	}
}

// errorGap returns what the message msg of e leaves out, or "".
func errorGap(e *Error, msg string) string {
	switch {
	case !strings.HasPrefix(msg, "config: "):
		return "does not start with config: "
	case e.Source == "":
		return "has no source"
	case e.kind == kindUnreadable || e.kind == kindMalformed:
		if e.Value == "" || !strings.Contains(msg, e.Source) {
			return "does not name the file"
		}
	case e.Key == "":
		return "names no key"
	case !strings.Contains(msg, e.Key) && !strings.Contains(msg, strconv.Quote(e.Key)):
		return "does not name its key"
	case e.kind != kindUnknownEnv && !strings.Contains(msg, e.Source):
		return "does not say where the value came from"
	}
	return ""
}
