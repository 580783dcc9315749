package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// dnsVIP is the UDP service of TestKernelRestartKeepsUDPFlows.
var dnsVIP = netip.MustParseAddrPort("10.96.0.53:53")

// dnsManifest is a UDP service on dnsVIP with endpoints on the named pods.
func dnsManifest(pods ...string) string {
	s := `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: ` + dnsVIP.Addr().String() + `
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 8080}]
endpoints:
`
	for _, p := range pods {
		for _, spec := range netns.ThreePods() {
			if spec.Name == p {
				s += fmt.Sprintf("  - {addresses: [%s], conditions: {ready: true}, nodeName: %s}\n", spec.IP, demoNode)
			}
		}
	}
	return s
}

// TestKernelRestartKeepsUDPFlows restarts weir run while UDP clients that
// keep their source port talk to a service, one of whose two endpoints
// goes while Weir is down. The restart's first sync reconciles conntrack
// instead of clearing the service's flows: the flows to the endpoint that
// stayed survive, those to the one that went are deleted, and those
// clients reach the remaining endpoint at once (kubernetes#122740).
func TestKernelRestartKeepsUDPFlows(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	dir := t.TempDir()
	manifest := filepath.Join(dir, "dns.yaml")
	if err := os.WriteFile(manifest, []byte(dnsManifest("pod-a", "pod-b")), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--source-path", dir, "--node-name", demoNode, "--conntrack-max-per-core", "0"}
	d := startDaemon(t, topo.Node, weir, args...)
	byPod := map[string][]*netns.UDPConn{}
	for port := uint16(41000); port < 41100 && (len(byPod["pod-a"]) == 0 || len(byPod["pod-b"]) == 0); port++ {
		c, err := topo.Client.DialUDP(netip.AddrPortFrom(topo.ClientIP, port), dnsVIP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a, err := askUDP(c)
		for deadline := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(deadline); a, err = askUDP(c) {
			d.mustRun(t) // the first clients wait for the first sync
		}
		if err != nil {
			t.Fatalf("client %d: %v", port, err)
		}
		byPod[a.Pod] = append(byPod[a.Pod], c)
	}
	if len(byPod["pod-a"]) == 0 || len(byPod["pod-b"]) == 0 {
		t.Fatalf("100 clients did not reach both pods: %d to pod-a, %d to pod-b", len(byPod["pod-a"]), len(byPod["pod-b"]))
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(10 * time.Second); err != nil {
		t.Fatalf("weir run after SIGTERM: %v\n%s", err, d.out)
	}
	if err := os.WriteFile(manifest, []byte(dnsManifest("pod-a")), 0o644); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, topo.Node, weir, args...)
	d.waitLog(t, `msg="Synced rules" full=true`, 30*time.Second)
	want := fmt.Sprintf(`msg="Deleted conntrack entries no serving endpoint answers" entries=%d `, len(byPod["pod-b"]))
	if out := d.out.String(); !strings.Contains(out, want) || strings.Contains(out, "Cleared stale conntrack entries") {
		t.Errorf("the restart's first sync did not delete exactly the %d flows to pod-b (%s):\n%s", len(byPod["pod-b"]), want, out)
	}
	for pod, clients := range byPod {
		for _, c := range clients {
			if a, err := askUDP(c); err != nil || a.Pod != "pod-a" {
				t.Errorf("a client of %s after the restart: %v, %v; want pod-a", pod, a, err)
			}
		}
	}
}

// askUDP sends one probe on c and waits a second for the answer.
func askUDP(c *netns.UDPConn) (netns.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ask(ctx)
}
