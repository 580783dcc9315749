package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigConvert converts the KubeProxyConfiguration of kubeadm's
// kube-proxy ConfigMap: the Weir YAML names kube-proxy's mode, kubeconfig,
// clusterCIDR and where its iptables mode serves node ports, and weir plan
// accepts it as its --config. A field Weir does not implement exits 2
// naming it.
func TestConfigConvert(t *testing.T) {
	kubeadm := filepath.Join("..", "..", "core", "config", "testdata", "kubeadm-kube-proxy.conf")
	code, stdout, stderr := invoke(t, "config", "convert", kubeadm)
	if code != 0 || stderr != "" {
		t.Fatalf("weir config convert: exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"mode: iptables", "kind: kubernetes", "kubeconfig: /var/lib/kube-proxy/kubeconfig.conf", "clusterCIDRs: 10.244.0.0/16",
		"nodePortAddresses:\n    - all", "localhostNodePorts: true"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("converted YAML lacks %q:\n%s", want, stdout)
		}
	}
	converted := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(converted, []byte(stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	// The converted file is Weir's own: the files source and its path
	// override the kubernetes source for this check.
	if code, _, stderr := invoke(t, "plan", "--config", converted, "--source-kind", "files", "--source-path", "testdata/manifests", "--node-name", "n1"); code != 0 {
		t.Errorf("weir plan --config <converted>: exit %d\n%s", code, stderr)
	}

	bad := filepath.Join(t.TempDir(), "kube-proxy.conf")
	if err := os.WriteFile(bad, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: BridgeInterface\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"config", "convert", bad}, {"plan", "--config", bad, "--source-path", "testdata/manifests"}} {
		code, _, stderr := invoke(t, args...)
		if code != exitUsage || !strings.Contains(stderr, "KubeProxyConfiguration field detectLocalMode") {
			t.Errorf("weir %s: exit %d, stderr %q; want %d naming detectLocalMode", strings.Join(args, " "), code, stderr, exitUsage)
		}
	}
}

// TestConfigConvertNodePorts: a kube-proxy nftables configuration without
// nodePortAddresses converts to kube-proxy's nftables default written out
// (primary, no loopback); iptables.localhostNodePorts there is a comment
// on stderr, since kube-proxy applies it in iptables mode only; the
// localhost keyword exits 2 naming nodePortAddresses.
func TestConfigConvertNodePorts(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	dir := t.TempDir()
	nft := filepath.Join(dir, "nftables.conf")
	if err := os.WriteFile(nft, []byte(head+"mode: nftables\niptables: {localhostNodePorts: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := invoke(t, "config", "convert", nft)
	if code != 0 || !strings.Contains(stderr, "# KubeProxyConfiguration field iptables.localhostNodePorts: ignored") {
		t.Fatalf("weir config convert: exit %d, stderr %q; want 0 and a comment on iptables.localhostNodePorts", code, stderr)
	}
	for _, want := range []string{"mode: nftables", "nodePortAddresses:\n    - primary", "localhostNodePorts: false"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("converted YAML lacks %q:\n%s", want, stdout)
		}
	}
	localhost := filepath.Join(dir, "localhost.conf")
	if err := os.WriteFile(localhost, []byte(head+"nodePortAddresses: [localhost]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = invoke(t, "config", "convert", localhost)
	if code != exitUsage || !strings.Contains(stderr, "nodePortAddresses") || !strings.Contains(stderr, "localhost is not supported") {
		t.Errorf("weir config convert of the localhost keyword: exit %d, stderr %q; want %d naming nodePortAddresses", code, stderr, exitUsage)
	}
}

// TestLocalhostNodePortsWarning: localhostNodePorts on in mode nftables,
// where nodePortAddresses defaults to primary, is logged as having no
// effect.
func TestLocalhostNodePortsWarning(t *testing.T) {
	code, _, stderr := invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1", "--localhost-node-ports")
	if code != 0 || !strings.Contains(stderr, `msg="A setting has no effect"`) || !strings.Contains(stderr, "nodePortAddresses to [all]") {
		t.Errorf("weir plan --localhost-node-ports: exit %d, stderr %q; want 0 and a warning", code, stderr)
	}
	code, _, stderr = invoke(t, "plan", "--source-path", "testdata/manifests", "--node-name", "n1", "--localhost-node-ports", "--node-port-addresses=all")
	if code != 0 || strings.Contains(stderr, "no effect") {
		t.Errorf("weir plan --localhost-node-ports --node-port-addresses=all: exit %d, stderr %q; want 0 and no warning", code, stderr)
	}
}
