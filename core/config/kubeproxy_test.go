package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
)

// kubeadmConfig is the config.conf of the kube-proxy ConfigMap kubeadm
// writes (every field, most at their zero value), with clusterCIDR set.
func kubeadmConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/kubeadm-kube-proxy.conf")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKubeProxyConfigKubeadm loads kubeadm's KubeProxyConfiguration as
// Weir's configuration: kube-proxy's defaults where it leaves fields at
// zero (iptables mode on Linux), its kubeconfig, its clusterCIDR, and no
// warning.
func TestKubeProxyConfigKubeadm(t *testing.T) {
	c, err := load(t, input{yaml: kubeadmConfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Mode = "iptables"
	want.Source = SourceConfig{Kind: "kubernetes", Path: want.Source.Path, Kubeconfig: "/var/lib/kube-proxy/kubeconfig.conf"}
	want.ClusterCIDRs = prefixes(t, "10.244.0.0/16")
	if got := *c; got.Mode != want.Mode || got.Source != want.Source || len(got.ClusterCIDRs) != 1 ||
		got.ClusterCIDRs[0] != want.ClusterCIDRs[0] || got.Conntrack != want.Conntrack || got.SyncPeriod != want.SyncPeriod ||
		got.MinSyncPeriod != want.MinSyncPeriod || got.HealthzBindAddress != want.HealthzBindAddress ||
		got.MetricsBindAddress != want.MetricsBindAddress || !got.LocalhostNodePorts || got.IPVS != want.IPVS {
		t.Errorf("kubeadm's KubeProxyConfiguration loaded as %+v, want %+v", got, want)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings on kubeadm's defaults: %q", c.Warnings)
	}
}

// TestKubeProxyConfigFields sets the fields Weir implements and checks
// each lands on its key, with kube-proxy's conventions (a bind address
// without a port, the mode's own sync periods, ipvs taking masqueradeAll
// from the iptables section).
func TestKubeProxyConfigFields(t *testing.T) {
	yaml := `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
hostnameOverride: Node-1
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
healthzBindAddress: 0.0.0.0
metricsBindAddress: 127.0.0.1:10999
nodePortAddresses: [primary]
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: veth}
iptables: {masqueradeAll: true, masqueradeBit: 14, localhostNodePorts: false, syncPeriod: 10s}
ipvs: {scheduler: wrr, strictARP: true, syncPeriod: 45s, minSyncPeriod: 2s}
conntrack: {maxPerCore: 0, tcpBeLiberal: true, udpTimeout: 30s}
logging: {format: json, verbosity: 4}
`
	c, err := load(t, input{yaml: yaml})
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]bool{
		"mode":               c.Mode == "ipvs",
		"nodeName":           c.NodeName == "node-1",
		"clusterCIDRs":       len(c.ClusterCIDRs) == 2,
		"healthzBindAddress": c.HealthzBindAddress == "0.0.0.0:10256",
		"metricsBindAddress": c.MetricsBindAddress == "127.0.0.1:10999",
		"nodePortAddresses":  c.NodePortAddresses.Primary,
		"localDetector":      c.LocalDetector == LocalDetectorConfig{Mode: backends.DetectInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
		"masqueradeAll":      c.MasqueradeAll,
		// kube-proxy ignores iptables.localhostNodePorts in ipvs mode.
		"localhostNodePorts": c.LocalhostNodePorts,
		"ipvs sync periods":  c.SyncPeriod == 45*time.Second && c.MinSyncPeriod == 2*time.Second,
		"ipvs.scheduler":     c.IPVS.Scheduler == "wrr" && c.IPVS.StrictARP,
		"conntrack":          c.Conntrack.MaxPerCore == 0 && c.Conntrack.Min == 131072 && c.Conntrack.TCPBeLiberal && c.Conntrack.UDPTimeout == 30*time.Second,
		"log":                c.Log == LogConfig{Format: "json", Level: "debug"},
		"source":             c.Source.Kind == "kubernetes" && c.Source.Kubeconfig == "",
	}
	for what, ok := range checks {
		if !ok {
			t.Errorf("%s not converted: %+v", what, c)
		}
	}
}

// TestKubeProxyConfigRefused: a field Weir does not implement, set to
// something else than kube-proxy's default, fails the load naming it; so
// does an unknown field. Fields that do not matter on Weir are warnings.
func TestKubeProxyConfigRefused(t *testing.T) {
	base := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for yaml, field := range map[string]string{
		"mode: kernelspace\n":                              "mode",
		"detectLocalMode: BridgeInterface\n":               "detectLocalMode",
		"detectLocal: {bridgeInterface: cbr0}\n":           "detectLocal.bridgeInterface",
		"bindAddress: 192.168.0.10\n":                      "bindAddress",
		"iptables: {masqueradeBit: 12}\n":                  "iptables.masqueradeBit",
		"mode: ipvs\nipvs: {excludeCIDRs: [10.0.0.0/8]}\n": "ipvs.excludeCIDRs",
		"mode: ipvs\nipvs: {tcpTimeout: 900s}\n":           "ipvs.tcpTimeout",
		"udpIdleTimeout: 250ms\n":                          "udpIdleTimeout",
		"iptables: {typo: 1}\n":                            "iptables.typo",
	} {
		_, err := load(t, input{yaml: base + yaml})
		if err == nil || !strings.Contains(err.Error(), "KubeProxyConfiguration field "+field+":") {
			t.Errorf("%q: got %v, want an error naming field %s", yaml, err, field)
		}
	}
	if _, err := load(t, input{yaml: "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n"}); err == nil ||
		!strings.Contains(err.Error(), "field apiVersion:") {
		t.Errorf("another apiVersion: got %v", err)
	}
	c, err := load(t, input{yaml: base + "oomScoreAdj: -999\nenableProfiling: true\nclientConnection: {qps: 5}\nconfigSyncPeriod: 15m0s\n"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 2 || !strings.HasPrefix(strings.Join(c.Warnings, "|"), "clientConnection.qps: ignored") {
		t.Errorf("warnings %q, want clientConnection.qps and oomScoreAdj", c.Warnings)
	}
	if !c.EnableProfiling {
		t.Error("enableProfiling: true did not turn profiling on")
	}
}
