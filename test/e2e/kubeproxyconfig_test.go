//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// kubeadmConfig is the KubeProxyConfiguration kubeadm v1.37 writes into the
// kube-proxy ConfigMap, every field at kubeadm's value.
const kubeadmConfig = "../../core/config/testdata/kubeadm-kube-proxy.conf"

// The node of TestKubeProxyConfiguration and the ports its configuration
// moves Weir's servers to, away from kube-proxy's defaults (10256 and
// 10249), so that an answer there proves the file was read.
const (
	configNode  = "node-kp"
	healthzPort = 10266
	metricsPort = 10259
)

// configPods are the netns pods behind the Service of
// TestKubeProxyConfiguration.
var configPods = webPods[:2]

// TestKubeProxyConfiguration runs `weir run --config` with nothing but a
// KubeProxyConfiguration as kubeadm writes it (its clientConnection,
// hostnameOverride, clusterCIDR, mode, bind addresses and one conntrack
// timeout set for this node), against the real control plane:
//
//  1. the same file with one field Weir does not implement set
//     (nftables.masqueradeBit: 15) makes weir run exit with status 2,
//     naming the field on stderr, before it programs anything;
//  2. Weir serves a NodePort Service over two ready Pods with real TCP
//     connections on its cluster IP and its node port; a client outside
//     clusterCIDR is masqueraded on both;
//  3. the settings took effect: /healthz and /livez answer on
//     healthzBindAddress and /metrics and /proxyMode ("nftables") on
//     metricsBindAddress, not on kube-proxy's default ports; the table is
//     nftables; nf_conntrack_udp_timeout is conntrack.udpTimeout and
//     nf_conntrack_tcp_timeout_established kube-proxy's default for a null
//     conntrack.tcpEstablishedTimeout (24h).
func TestKubeProxyConfiguration(t *testing.T) {
	netns.RequireRoot(t)
	bin := weirBinary(t)
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	topo := netns.NewT(t, netns.Options{Pods: configPods})
	createNode(ctx, t, cp, configNode, topo.NodeIP)
	svc := serviceObject("web", nil)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc = createSvc(ctx, t, cp, svc)
	for _, p := range configPods {
		createReadyPod(ctx, t, cp, p.Name, "web", configNode, p.IP.String())
	}
	settings := kubeProxySettings(weirKubeconfig(t, cp, configNode), topo.NodeIP)

	t.Run("refused field", func(t *testing.T) {
		bad := maps.Clone(settings)
		bad["nftables.masqueradeBit"] = 15
		wantRefused(t, bin, topo.Node, writeKubeProxyConfig(t, bad), "nftables.masqueradeBit")
	})

	forwardAPIServer(t, cp, topo.Node)
	d := runWeir(t, topo.Node, configNode, "run", "--config", writeKubeProxyConfig(t, settings))
	vip := clusterIP(t, svc)
	nodePort := netip.AddrPortFrom(topo.NodeIP, uint16(svc.Spec.Ports[0].NodePort))
	waitSet(t, d, topo.Client, vip, time.Minute, "web-0", "web-1")
	waitSet(t, d, topo.Client, nodePort, programmingLimit, "web-0", "web-1")
	for _, addr := range []netip.AddrPort{vip, nodePort} {
		if a, err := dial(topo.Client, addr, 3*time.Second); err != nil || a.Source.Addr() != topo.NodeIP {
			t.Errorf("%s from %s, outside clusterCIDR: answer %v, %v; want the source masqueraded to %s",
				addr, topo.ClientIP, a, err, topo.NodeIP)
		}
	}
	checkServers(t, d, topo)
	checkNFTables(t, topo.Node, vip)
	checkSysctl(t, topo.Node, "net.netfilter.nf_conntrack_udp_timeout", "45")
	checkSysctl(t, topo.Node, "net.netfilter.nf_conntrack_tcp_timeout_established", "86400")
}

// kubeProxySettings are the fields TestKubeProxyConfiguration sets in
// kubeadm's file, by dotted path: what kubeadm's user (or kubeadm itself)
// fills in for this node.
func kubeProxySettings(kubeconfig string, nodeIP netip.Addr) map[string]any {
	return map[string]any{
		"clientConnection.kubeconfig": kubeconfig,
		"hostnameOverride":            configNode,
		"clusterCIDR":                 netns.DefaultPodCIDR.String(),
		"mode":                        "nftables",
		"healthzBindAddress":          netip.AddrPortFrom(nodeIP, healthzPort).String(),
		"metricsBindAddress":          netip.AddrPortFrom(nodeIP, metricsPort).String(),
		"conntrack.udpTimeout":        "45s",
	}
}

// writeKubeProxyConfig writes kubeadm's KubeProxyConfiguration with
// settings (dotted paths to existing fields) applied into a file of its
// own and returns its path.
func writeKubeProxyConfig(t *testing.T, settings map[string]any) string {
	t.Helper()
	raw, err := os.ReadFile(kubeadmConfig)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", kubeadmConfig, err)
	}
	for path, v := range settings {
		setPath(t, doc, path, v)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setPath sets the field at a dotted path of doc, which kubeadm's file
// must already have: the test changes kubeadm's values, it adds no field.
func setPath(t *testing.T, doc map[string]any, path string, v any) {
	t.Helper()
	parts := strings.Split(path, ".")
	m := doc
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			t.Fatalf("kubeadm's KubeProxyConfiguration has no section %q (setting %s)", p, path)
		}
		m = sub
	}
	last := parts[len(parts)-1]
	if _, ok := m[last]; !ok {
		t.Fatalf("kubeadm's KubeProxyConfiguration has no field %s", path)
	}
	m[last] = v
}

// wantRefused runs `weir run --config config` in ns and fails the test
// unless it exits with status 2 within 30 s, naming field on stderr as a
// KubeProxyConfiguration field, and leaves ns without Weir's table.
func wantRefused(t *testing.T, bin string, ns *netns.Namespace, config, field string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := ns.Command(ctx, bin, "run", "--config", config)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || ctx.Err() != nil {
		t.Fatalf("weir run with %s set: %v (context %v); want exit status 2\nstdout:\n%s\nstderr:\n%s",
			field, err, ctx.Err(), &stdout, &stderr)
	}
	if want := "KubeProxyConfiguration field " + field + ":"; !strings.Contains(stderr.String(), want) {
		t.Errorf("weir run's stderr lacks %q:\n%s", want, &stderr)
	}
	t.Logf("weir run with %s set exited with status 2: %s", field, strings.TrimSpace(stderr.String()))
	if out, err := ns.Command(t.Context(), "nft", "list", "table", "ip", "weir").CombinedOutput(); err == nil {
		t.Errorf("the refused weir run left a table ip weir behind:\n%s", out)
	}
}

// checkServers checks, from the client, that the health server answers on
// healthzBindAddress and the metrics server on metricsBindAddress, and
// that neither listens on kube-proxy's default port.
func checkServers(t *testing.T, d *weirDaemon, topo *netns.Topology) {
	t.Helper()
	healthz := netip.AddrPortFrom(topo.NodeIP, healthzPort).String()
	metrics := netip.AddrPortFrom(topo.NodeIP, metricsPort).String()
	if got := d.serving(t, "healthzBindAddress"); got != healthz {
		t.Errorf("healthz server on %s, want %s", got, healthz)
	}
	if got := d.serving(t, "metricsBindAddress"); got != metrics {
		t.Errorf("metrics server on %s, want %s", got, metrics)
	}
	c := topo.Client.HTTPClient(3 * time.Second)
	waitGet(t, d, c, "http://"+healthz+"/healthz", `"nodeEligible": true`)
	waitGet(t, d, c, "http://"+healthz+"/livez", `"lastUpdated"`)
	waitGet(t, d, c, "http://"+metrics+"/metrics", "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
	waitGet(t, d, c, "http://"+metrics+"/proxyMode", "nftables")

	node := topo.Node.HTTPClient(3 * time.Second)
	for _, u := range []struct {
		c   *http.Client
		url string
	}{
		{c, "http://" + netip.AddrPortFrom(topo.NodeIP, 10256).String() + "/healthz"},
		{node, "http://127.0.0.1:10249/metrics"},
	} {
		if code, _, err := get(u.c, u.url); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("GET %s (kube-proxy's default port): %d, %v; want connection refused", u.url, code, err)
		}
	}
}

// waitGet polls url with c until it answers 200 with a body containing
// want, and fails the test after 30 s.
func waitGet(t *testing.T, d *weirDaemon, c *http.Client, url, want string) {
	t.Helper()
	last := "no answer yet"
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d.mustRun(t)
		code, body, err := get(c, url)
		if err != nil {
			last = err.Error()
			continue
		}
		last = strconv.Itoa(code) + " " + firstLine(body)
		if code == http.StatusOK && strings.Contains(body, want) {
			t.Logf("GET %s: %s", url, last)
			return
		}
	}
	t.Fatalf("GET %s: no 200 answer containing %q within 30s; last: %s", url, want, last)
}

// firstLine is s up to its first newline, at most 200 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// checkNFTables checks that ns holds Weir's nftables table and that it
// names vip: mode nftables took effect (kubeadm's mode "" is iptables).
func checkNFTables(t *testing.T, ns *netns.Namespace, vip netip.AddrPort) {
	t.Helper()
	out, err := ns.Command(t.Context(), "nft", "list", "table", "ip", "weir").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table ip weir in %s: %v\n%s", ns.Name, err, out)
	}
	if !strings.Contains(string(out), vip.Addr().String()) {
		t.Errorf("table ip weir does not mention the cluster IP %s:\n%s", vip.Addr(), out)
	}
}

// checkSysctl checks the value of the sysctl key in ns.
func checkSysctl(t *testing.T, ns *netns.Namespace, key, want string) {
	t.Helper()
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	var got []byte
	err := ns.Do(func() (err error) {
		got, err = os.ReadFile(path) // /proc/sys/net resolves against this thread's namespace
		return err
	})
	if err != nil {
		t.Fatalf("read %s in %s: %v", key, ns.Name, err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Errorf("%s in %s = %s, want %s", key, ns.Name, strings.TrimSpace(string(got)), want)
	}
}
