//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// The node of TestConntrackReconcilerOnRestart, its two DNS pods (netns
// pods answer UDP on podPort too), the pod that stays and the one that goes
// while Weir is down.
const (
	ctNode  = "node-ct"
	ctStays = "dns-0"
	ctGoes  = "dns-1"
)

var dnsPods = []netns.PodSpec{
	{Name: ctStays, IP: netip.MustParseAddr("10.244.0.31"), Ports: []uint16{podPort}},
	{Name: ctGoes, IP: netip.MustParseAddr("10.244.0.32"), Ports: []uint16{podPort}},
}

// Client source ports of TestConntrackReconcilerOnRestart's UDP flows, and
// the datagrams each sends before Weir stops.
const (
	ctFirstPort = 42000
	ctLastPort  = 42100
	ctAsks      = 3
)

// TestConntrackReconcilerOnRestart proves the conntrack reconciler of
// Weir's first sync against the real control plane. A kube-dns-like
// Service (53/UDP and 53/TCP) has two ready Pods; UDP clients that keep
// their source port reach each through the cluster IP, so the node's
// conntrack holds entries DNATed to both. Weir is stopped (SIGTERM, its
// rules stay), dns-1's Pod is deleted and the EndpointSlice controller
// drops it, and Weir is started again. Once its first full sync is done:
//
//   - every entry DNATed to dns-0 is still there, the same entry (its
//     packet counter carried over), and the same socket still reaches
//     dns-0 through it;
//   - every entry DNATed to dns-1 is gone, so those sockets reach dns-0 at
//     once rather than a deleted Pod; Weir logs exactly that many
//     deletions.
//
// The reconciler's metrics (kubeproxy_conntrack_reconciler_*) count the
// deleted entries.
func TestConntrackReconcilerOnRestart(t *testing.T) {
	netns.RequireRoot(t)
	weirBinary(t)
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	topo := netns.NewT(t, netns.Options{Pods: dnsPods})
	// Per-entry packet counters tell an entry that survived from a new one.
	if err := topo.Node.Sysctl("net.netfilter.nf_conntrack_acct", "1"); err != nil {
		t.Fatal(err)
	}
	createNode(ctx, t, cp, ctNode, topo.NodeIP)
	svc := createSvc(ctx, t, cp, dnsService())
	for _, p := range dnsPods {
		createReadyPod(ctx, t, cp, p.Name, "dns", ctNode, p.IP.String())
	}
	vip := clusterIP(t, svc)
	forwardAPIServer(t, cp, topo.Node)
	args := weirArgs(t, cp, ctNode)

	d := runWeir(t, topo.Node, ctNode+" (before the restart)", args...)
	// Over TCP, to leave no UDP entry but the clients' own.
	waitSet(t, d, topo.Client, vip, time.Minute, ctStays, ctGoes)
	byPod := udpClients(t, topo, vip)
	before := udpEntries(t, topo.Node, vip, topo.ClientIP)
	checkEntries(t, "before the restart", before, byPod, ctAsks)

	d.stop(t)
	removePod(ctx, t, cp, ctGoes, dnsPods[1].IP.String())
	restart := time.Now()
	d = runWeir(t, topo.Node, ctNode+" (after the restart)", args...)
	d.waitLog(t, `msg="Synced rules" full=true`)
	t.Logf("weir run restarted: first full sync after %v", time.Since(restart).Round(time.Millisecond))
	after := waitGone(t, topo.Node, vip, topo.ClientIP, byPod[ctGoes])
	checkEntries(t, "after the restart", after, map[string][]*netns.UDPConn{ctStays: byPod[ctStays]}, ctAsks)
	want := fmt.Sprintf(`msg="Deleted conntrack entries no serving endpoint answers" entries=%d `, len(byPod[ctGoes]))
	if out := d.out.String(); !strings.Contains(out, want) || strings.Contains(out, "Cleared stale conntrack entries") {
		t.Errorf("the restart's first sync did not log deleting exactly the %d flows to %s (%s)", len(byPod[ctGoes]), ctGoes, want)
	}
	askAll(t, byPod, ctStays)
	checkEntries(t, "after asking again", udpEntries(t, topo.Node, vip, topo.ClientIP),
		map[string][]*netns.UDPConn{ctStays: byPod[ctStays]}, ctAsks+1)
	wantReconcilerMetrics(t, d, topo.Node, len(byPod[ctGoes]))
}

// dnsService is a ClusterIP Service dns selecting app=dns, like kube-dns:
// port 53 over UDP and TCP, to the pods' podPort.
func dnsService() *corev1.Service {
	target := intstr.FromInt32(podPort)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dns", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "dns"},
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: target},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: target},
			},
		},
	}
}

// udpClients opens UDP sockets from the client on fixed source ports, one
// after another, until the cluster IP vip has sent at least one to each
// pod; each asks ctAsks times, always answered by the same pod. It returns
// the sockets by the pod that answered; they are closed when the test
// ends.
func udpClients(t *testing.T, topo *netns.Topology, vip netip.AddrPort) map[string][]*netns.UDPConn {
	t.Helper()
	byPod := map[string][]*netns.UDPConn{}
	for port := uint16(ctFirstPort); port < ctLastPort && (len(byPod[ctStays]) == 0 || len(byPod[ctGoes]) == 0); port++ {
		c, err := topo.Client.DialUDP(netip.AddrPortFrom(topo.ClientIP, port), vip)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		first := askOnce(t, c, "")
		for range ctAsks - 1 {
			askOnce(t, c, first.Pod)
		}
		byPod[first.Pod] = append(byPod[first.Pod], c)
	}
	if len(byPod[ctStays]) == 0 || len(byPod[ctGoes]) == 0 {
		t.Fatalf("%d UDP clients did not reach both pods: %d to %s, %d to %s", ctLastPort-ctFirstPort,
			len(byPod[ctStays]), ctStays, len(byPod[ctGoes]), ctGoes)
	}
	t.Logf("UDP clients of %s: %d to %s, %d to %s", vip, len(byPod[ctStays]), ctStays, len(byPod[ctGoes]), ctGoes)
	return byPod
}

// askOnce sends one datagram on c and fails the test unless a pod
// answers within a second: want, if it is not empty.
func askOnce(t *testing.T, c *netns.UDPConn, want string) netns.Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	a, err := c.Ask(ctx)
	if err != nil || (want != "" && a.Pod != want) {
		t.Fatalf("UDP client %s: %v, %v; want an answer from %q", c.LocalAddr(), a, err, want)
	}
	return a
}

// askAll asks once on every socket of byPod and fails the test unless
// want answers each.
func askAll(t *testing.T, byPod map[string][]*netns.UDPConn, want string) {
	t.Helper()
	for pod, clients := range byPod {
		for _, c := range clients {
			a := askOnce(t, c, want)
			t.Logf("UDP client %s, first answered by %s: answered by %s after the restart", c.LocalAddr(), pod, a.Pod)
		}
	}
}

// removePod deletes the Pod name at once (grace period 0, as a kubelet
// finishing its termination would) and waits until the EndpointSlice
// controller has dropped its address ip from the Service dns's slices.
func removePod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name, ip string) {
	t.Helper()
	zero := int64(0)
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	start := time.Now()
	waitForSlice(ctx, t, cp, "default", "dns", func(s *discoveryv1.EndpointSlice) bool {
		return endpointReady(s, dnsPods[0].IP.String(), true) && !slices.ContainsFunc(s.Endpoints, func(e discoveryv1.Endpoint) bool {
			return slices.Contains(e.Addresses, ip)
		})
	})
	t.Logf("pod %s deleted: its address left the EndpointSlice after %v", name, time.Since(start).Round(time.Millisecond))
}

// udpEntry is what the test reads of one conntrack entry.
type udpEntry struct {
	reply   netip.AddrPort // the reply's source: the endpoint the flow was DNATed to
	packets uint64         // packets in the original direction
	timeout uint32         // seconds left
}

// udpEntries lists ns's conntrack entries of UDP flows from client to
// vip, by client source port.
func udpEntries(t *testing.T, ns *netns.Namespace, vip netip.AddrPort, client netip.Addr) map[uint16]udpEntry {
	t.Helper()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(ns.Fd()))
	if err != nil {
		t.Fatalf("netlink in %s: %v", ns.Name, err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("list conntrack entries in %s: %v", ns.Name, err)
	}
	out := map[uint16]udpEntry{}
	for _, f := range flows {
		fw := f.Forward
		dst, _ := netip.AddrFromSlice(fw.DstIP)
		src, _ := netip.AddrFromSlice(fw.SrcIP)
		if fw.Protocol != unix.IPPROTO_UDP || dst.Unmap() != vip.Addr() || fw.DstPort != vip.Port() || src.Unmap() != client {
			continue
		}
		rsrc, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		out[fw.SrcPort] = udpEntry{reply: netip.AddrPortFrom(rsrc.Unmap(), f.Reverse.SrcPort), packets: fw.Packets, timeout: f.TimeOut}
	}
	return out
}

// checkEntries fails the test unless every socket of byPod has exactly
// one entry among entries, DNATed to its pod's address and port, that has
// counted asks packets.
func checkEntries(t *testing.T, when string, entries map[uint16]udpEntry, byPod map[string][]*netns.UDPConn, asks uint64) {
	t.Helper()
	for pod, clients := range byPod {
		want := netip.AddrPortFrom(podIP(t, pod), podPort)
		for _, c := range clients {
			e, ok := entries[c.LocalAddr().Port()]
			switch {
			case !ok:
				t.Errorf("%s: no conntrack entry for the UDP flow from %s (to %s)", when, c.LocalAddr(), pod)
			case e.reply != want || e.packets != asks:
				t.Errorf("%s: the entry of the UDP flow from %s replies from %s after %d packets; want %s (%s) after %d",
					when, c.LocalAddr(), e.reply, e.packets, want, pod, asks)
			default:
				t.Logf("%s: UDP flow from %s DNATed to %s (%s), %d packets, %ds left", when, c.LocalAddr(), e.reply, pod, e.packets, e.timeout)
			}
		}
	}
}

// podIP is the address of the DNS pod name.
func podIP(t *testing.T, name string) netip.Addr {
	t.Helper()
	for _, p := range dnsPods {
		if p.Name == name {
			return p.IP
		}
	}
	t.Fatalf("no DNS pod %s", name)
	return netip.Addr{}
}

// waitGone polls ns's conntrack table until no entry of the sockets gone
// is left, and returns the table then; it fails the test after 10 s.
func waitGone(t *testing.T, ns *netns.Namespace, vip netip.AddrPort, client netip.Addr, gone []*netns.UDPConn) map[uint16]udpEntry {
	t.Helper()
	var entries map[uint16]udpEntry
	left := func() []string {
		var l []string
		for _, c := range gone {
			if e, ok := entries[c.LocalAddr().Port()]; ok {
				l = append(l, fmt.Sprintf("%s -> %s", c.LocalAddr(), e.reply))
			}
		}
		return l
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries = udpEntries(t, ns, vip, client)
		l := left()
		if len(l) == 0 {
			return entries
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the restart's first sync the entries of the flows to %s are still there: %v", ctGoes, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logReconcilerMetrics logs the kubeproxy_conntrack_reconciler_* samples
// wantReconcilerMetrics checks Weir's conntrack reconciler metrics after
// the restart: deleted IPv4 entries count exactly the deleted flows, and
// the reconciler's duration was observed.
func wantReconcilerMetrics(t *testing.T, d *weirDaemon, node *netns.Namespace, deleted int) {
	t.Helper()
	addr := d.serving(t, "metricsBindAddress")
	code, body, err := get(node.HTTPClient(3*time.Second), "http://"+addr+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %v", addr, code, err)
	}
	for _, want := range []string{
		fmt.Sprintf(`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} %d`+"\n", deleted),
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q", strings.TrimSpace(want))
		}
	}
}
