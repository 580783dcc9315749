package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigConvert converts the KubeProxyConfiguration of kubeadm's
// kube-proxy ConfigMap: the Weir YAML names kube-proxy's mode, kubeconfig
// and clusterCIDR, and weir plan accepts it as its --config. A field Weir
// does not implement exits 2 naming it.
func TestConfigConvert(t *testing.T) {
	kubeadm := filepath.Join("..", "..", "core", "config", "testdata", "kubeadm-kube-proxy.conf")
	code, stdout, stderr := invoke(t, "config", "convert", kubeadm)
	if code != 0 || stderr != "" {
		t.Fatalf("weir config convert: exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"mode: iptables", "kind: kubernetes", "kubeconfig: /var/lib/kube-proxy/kubeconfig.conf", "clusterCIDRs: 10.244.0.0/16"} {
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
