package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// The least-conn test's service: pods greet on greetPort, the service's
// cluster IP forwards port 80 there.
const (
	greetPort = 9000
	held      = 12 // connections held open to pod-a
	probes    = 60 // new connections measured once the weights moved
)

// demoNodeManifest is the node the least-conn test's Weir runs on.
const demoNodeManifest = "apiVersion: v1\nkind: Node\nmetadata: {name: " + demoNode + "}\n"

// greetSpec and greetPorts make the web service forward to greetPort.
var (
	greetSpec  = fmt.Sprintf("  type: ClusterIP\n  ports: [{name: http, protocol: TCP, port: 80, targetPort: %d}]\n", greetPort)
	greetPorts = fmt.Sprintf("[{name: http, port: %d, protocol: TCP}]", greetPort)
)

// TestKernelLeastConn runs weir run with the least-conn plugin, fed live
// signals, in nftables and iptables mode: connections held open to pod-a
// through the service make the plugin weight pod-a down, and new
// connections then go to pod-b and pod-c. Each mode gets its own pods.
func TestKernelLeastConn(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	plugin := buildPlugin(t, "least-conn")
	for _, mode := range [][]string{{"--mode", "nftables"}, {"--mode", "iptables", "--iptables-backend", "nft"}} {
		t.Run(mode[1], func(t *testing.T) { leastConn(t, weir, plugin, mode, startDaemon) })
	}
}

// daemonStarter starts weir with args in a namespace.
type daemonStarter func(t *testing.T, ns *netns.Namespace, weir string, args ...string) *daemon

// leastConn is one mode's run of TestKernelLeastConn, and of its IPVS
// twin in the VM.
func leastConn(t *testing.T, weir, plugin string, mode []string, start daemonStarter) {
	topo := netns.NewThreePods(t)
	for _, p := range topo.Pods {
		g, err := netns.StartGreeter(p, greetPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(demoNodeManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, a := range []string{"10.244.0.11", "10.244.0.12", "10.244.0.13"} {
		eps = append(eps, demoEndpoint(a, demoNode, readyCond))
	}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest(greetSpec, eps, greetPorts)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--source-path", dir, "--node-name", demoNode, "--config", leastConnConfig(t, plugin),
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"}, mode...)
	d := start(t, topo.Node, weir, args...)
	d.waitLog(t, `msg="Synced rules"`, 30*time.Second)
	vip := netip.MustParseAddrPort("10.96.0.10:80")

	// Hold connections to pod-a; close those that reach another pod.
	var onA int
	for tries := 0; onA < held; tries++ {
		if tries == 40*held {
			t.Fatalf("only %d of %d connections reached pod-a in %d tries", onA, held, tries)
		}
		c, pod := greet(t, topo.Client, vip)
		if pod == "pod-a" {
			onA++
			t.Cleanup(func() { c.Close() })
			continue
		}
		c.Close()
	}
	w := awaitWeights(t, d, topo.Node, func(w map[string]uint32) bool {
		return w["10.244.0.11"] > 0 && 4*w["10.244.0.11"] < w["10.244.0.12"] && 4*w["10.244.0.11"] < w["10.244.0.13"]
	})
	t.Logf("weights with %d connections held to pod-a: %v", held, w)

	count := map[string]int{}
	for range probes {
		c, pod := greet(t, topo.Client, vip)
		c.Close()
		count[pod]++
	}
	t.Logf("%d new connections went %v", probes, count)
	// Pod-a's share is its weight's, a few percent; by chance alone (a
	// third each) it would get 8 or fewer of 60 once in ten thousand runs.
	if count["pod-a"] > 8 || count["pod-b"] < 10 || count["pod-c"] < 10 {
		t.Errorf("new connections went %v with pod-a loaded (weights %v); want pod-a to get few", count, w)
	}
}

// leastConnConfig writes a Weir config that loads the least-conn plugin
// with connection signals read every 200 ms.
func leastConnConfig(t *testing.T, plugin string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	yaml := "hooks:\n  cacheDir: " + filepath.Join(t.TempDir(), "cache") + "\nplugins:\n" +
		"  - name: least-conn\n    path: " + plugin + "\n    signals: [connections]\n    interval: 200ms\n" +
		"    match: {namespaces: [default]}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// greet connects from the client to addr and returns the connection and
// the pod that greeted it.
func greet(t *testing.T, client *netns.Namespace, addr netip.AddrPort) (net.Conn, string) {
	t.Helper()
	var c net.Conn
	err := client.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		t.Fatalf("greeting through %s: %v", addr, err)
	}
	return c, strings.TrimSpace(line)
}

// awaitWeights polls the daemon's debug endpoint until the final weights
// of default/web's endpoints, by address, satisfy ok, and returns them.
func awaitWeights(t *testing.T, d *daemon, node *netns.Namespace, ok func(map[string]uint32) bool) map[string]uint32 {
	t.Helper()
	client := node.HTTPClient(2 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	var last map[string]uint32
	for time.Now().Before(deadline) {
		d.mustRun(t)
		resp, err := client.Get("http://127.0.0.1:10249" + debugServicePath + "?name=default/web")
		if err != nil {
			continue
		}
		var v serviceDetail
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || len(v.Final) != 1 {
			continue
		}
		last = map[string]uint32{}
		for _, e := range v.Final[0].Endpoints {
			last[e.Address.String()] = e.Weight
		}
		if ok(last) {
			return last
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon, not synchronising with it
	}
	t.Fatalf("weights of default/web never moved within 20s; last %v", last)
	return nil
}
