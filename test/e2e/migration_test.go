//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
)

// migrationMode is one kube-proxy mode the migration runs in; Weir runs
// in the same mode.
type migrationMode struct {
	mode string
	// flavour is kube-proxy's iptables flavour in mode iptables. Weir
	// keeps iptables.backend auto and must find it by itself.
	flavour string
}

// migrationModes are the modes TestMigration covers. iptables-nft is the
// flavour of Debian's and most distributions' `iptables`, and the one
// kube-proxy's image picks on a node with no rules yet, so most nodes
// migrate with it; the soak covers Weir alone on iptables-legacy.
var migrationModes = []migrationMode{{mode: "nftables"}, {mode: "iptables", flavour: "nft"}}

// The node, its Services and its pods.
const (
	migrationNode = "migration-node"
	// migrationEchoPort is where every pod echoes lines, for the
	// long-lived connection; the Service web serves it on the same port.
	migrationEchoPort = 9090
	// migrationGoneAtTakeover is a Service deleted while no proxy runs,
	// between kube-proxy's stop and Weir's start: only kube-proxy's rules
	// know it, and none of them may remain once Weir has taken over.
	migrationGoneAtTakeover = "gone-at-takeover"
	// migrationGoneAtHandBack is deleted between Weir's stop and
	// kube-proxy's start: only Weir's rules know it, and none may remain
	// after the hand-back.
	migrationGoneAtHandBack = "gone-at-handback"
)

// migrationPods are the pods behind every Service of the test.
var migrationPods = []netns.PodSpec{
	{Name: "web-0", IP: netip.MustParseAddr("10.244.0.11"), Ports: []uint16{podPort}},
	{Name: "web-1", IP: netip.MustParseAddr("10.244.0.12"), Ports: []uint16{podPort}},
	{Name: "web-2", IP: netip.MustParseAddr("10.244.0.13"), Ports: []uint16{podPort}},
}

// TestMigration moves one node from kube-proxy to Weir and back, as
// docs/operations.md describes, with kube-proxy v1.37 in mode nftables,
// then iptables, against a real control plane each: a ClusterIP Service
// and a NodePort Service over three ready Pods (slices by the real
// EndpointSlice controller), a client that keeps opening short
// connections to the cluster IP and the node port, and one long-lived
// connection through the cluster IP.
//
//  1. kube-proxy serves.
//  2. The takeover: kube-proxy stops (its rules stay), `weir run
//     --takeover` starts, commits, then removes kube-proxy's rules.
//  3. The hand-back: Weir stops (its rules stay), kube-proxy starts and
//     syncs, then `weir cleanup --keep-kube-proxy` removes Weir's own.
//
// No short connection may fail or lose its first SYN in any phase, the
// long-lived one must carry on across both switches, each proxy must show
// that it served (metrics, rules, `weir verify`), and after each switch no
// rule of the proxy that left may remain.
func TestMigration(t *testing.T) {
	netns.RequireRoot(t)
	weirBinary(t)
	for _, m := range migrationModes {
		t.Run(m.mode, func(t *testing.T) { migrate(t, m) })
	}
}

// migrate runs the whole migration in mode m.
func migrate(t *testing.T, m migrationMode) {
	c := startMigrationCluster(t, m)
	kp := c.startKubeProxy(t)
	c.checkKubeProxyServes(t, kp)
	tr := startMigrationTraffic(t, c)
	tr.waitConnections(t, "kube-proxy", migrationSteadyConns)

	c.takeOver(t, kp, tr)
	tr.waitConnections(t, "Weir", migrationSteadyConns)
	c.handBack(t, tr)
	tr.waitConnections(t, "kube-proxy again", migrationSteadyConns)
	tr.finish(t)
}

// migrationSteadyConns is how many short connections each proxy must
// serve on its own before the next switch: about a second of traffic.
const migrationSteadyConns = 50

// migrationCluster is the node of one migration and what it serves.
type migrationCluster struct {
	mode     migrationMode
	cp       *controlplane.ControlPlane
	bins     controlplane.Binaries
	topo     *netns.Topology
	vip      netip.AddrPort // web's cluster IP, port 80
	echoVIP  netip.AddrPort // web's cluster IP, the echo port
	nodePort netip.AddrPort // web-nodeport on the node's address
	weir     *weirDaemon
}

// startMigrationCluster starts the control plane and the node with its
// pods, creates the Node, the Services and the Pods, waits until the
// EndpointSlice controller lists every pod as ready, and forwards the API
// server into the node.
func startMigrationCluster(t *testing.T, m migrationMode) *migrationCluster {
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false) // Weir's ServiceAccount and RBAC
	c := &migrationCluster{mode: m, cp: cp, bins: controlplane.RequireBinaries(t),
		topo: netns.NewT(t, netns.Options{Pods: migrationPods})}
	for _, p := range migrationPods {
		e, err := netns.StartEcho(c.topo.Pods[p.Name], migrationEchoPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
	}
	createNode(ctx, t, cp, migrationNode, c.topo.NodeIP)
	web := createSvc(ctx, t, cp, migrationService("web", corev1.ServiceTypeClusterIP, true))
	np := createSvc(ctx, t, cp, migrationService("web-nodeport", corev1.ServiceTypeNodePort, false))
	for _, name := range []string{migrationGoneAtTakeover, migrationGoneAtHandBack} {
		createSvc(ctx, t, cp, migrationService(name, corev1.ServiceTypeClusterIP, false))
	}
	for _, p := range migrationPods {
		createReadyPod(ctx, t, cp, p.Name, "web", migrationNode, p.IP.String())
	}
	for _, svc := range []string{"web", "web-nodeport"} {
		waitForSlice(ctx, t, cp, "default", svc, migrationAllReady)
	}
	c.vip = clusterIP(t, web)
	c.echoVIP = netip.AddrPortFrom(c.vip.Addr(), migrationEchoPort)
	c.nodePort = netip.AddrPortFrom(c.topo.NodeIP, uint16(np.Spec.Ports[0].NodePort))
	forwardAPIServer(t, cp, c.topo.Node)
	return c
}

// migrationAllReady says whether s lists every pod of the test as ready.
func migrationAllReady(s *discoveryv1.EndpointSlice) bool {
	for _, p := range migrationPods {
		if !endpointReady(s, p.IP.String(), true) {
			return false
		}
	}
	return true
}

// migrationService is a Service of type typ over the pods labelled
// app=web: port http 80 to their port http and, with echo, the echo port.
func migrationService(name string, typ corev1.ServiceType, echo bool) *corev1.Service {
	ports := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}
	if echo {
		ports = append(ports, corev1.ServicePort{Name: "echo", Port: migrationEchoPort, TargetPort: intstr.FromInt32(migrationEchoPort)})
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": "web"}, Ports: ports},
	}
}

// startKubeProxy runs kube-proxy in the node, in the test's mode, and
// waits for its first sync. It is stopped when the test ends, on every
// path; its log is printed when the test failed.
func (c *migrationCluster) startKubeProxy(t *testing.T) *kubeproxy.Process {
	t.Helper()
	kp, err := kubeproxy.Start(c.topo.Node, c.bins.KubeProxy, t.TempDir(), kubeproxy.Config{
		Mode: c.mode.mode, Flavour: c.mode.flavour, NodeName: migrationNode,
		Kubeconfig: c.cp.Kubeconfig, ClusterCIDRs: []netip.Prefix{netns.DefaultPodCIDR},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-kp.Done():
		default:
			_ = kp.Stop()
		}
		if t.Failed() {
			t.Logf("kube-proxy (started %s):\n%s", clock(kp.Started), kp.Log())
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := kp.WaitFirstSync(ctx); err != nil {
		t.Fatalf("kube-proxy: %v\n%s", err, kp.Log())
	}
	t.Logf("kube-proxy %s synced %v after its start", c.mode.mode, time.Since(kp.Started).Round(time.Millisecond))
	return kp
}

// checkKubeProxyServes checks that kube-proxy serves the cluster IP and
// the node port from all three pods, with rules of its own in the kernel.
func (c *migrationCluster) checkKubeProxyServes(t *testing.T, kp *kubeproxy.Process) {
	t.Helper()
	all := []string{"web-0", "web-1", "web-2"}
	for _, addr := range []netip.AddrPort{c.vip, c.nodePort} {
		netns.WantPods(t, "kube-proxy at "+addr.String(), netns.DialMany(t, c.topo.Client, addr, probeRun), all...)
	}
	r := readMigrationRules(t, c.topo.Node)
	switch c.mode.mode {
	case "nftables":
		if !slices.Contains(r.tables, "ip kube-proxy") {
			t.Fatalf("kube-proxy serves, but the node has no table ip kube-proxy: %v", r.tables)
		}
	case "iptables":
		if !strings.Contains(r.saves["iptables-"+c.mode.flavour], "default/web:http") {
			t.Fatalf("kube-proxy serves, but iptables-%s-save has no rule of default/web:http:\n%s", c.mode.flavour, r.saves["iptables-"+c.mode.flavour])
		}
	}
	if s, err := kp.Scrape(t.Context()); err != nil || s.Families["IPv4"].Syncs == 0 {
		t.Fatalf("kube-proxy's metrics show no sync: %v, %v", s, err)
	}
}

// takeOver is switch 1: kube-proxy stops, the Service
// migrationGoneAtTakeover is deleted (only kube-proxy's rules know it),
// `weir run --takeover` starts in the same mode; it returns once Weir has
// synced and taken over, and checks that no rule of kube-proxy's is left.
func (c *migrationCluster) takeOver(t *testing.T, kp *kubeproxy.Process, tr *migrationTraffic) {
	t.Helper()
	tr.setPhase("switch 1")
	if c.mode.mode == "iptables" {
		c.waitCanaries(t)
	}
	begin := time.Now()
	if err := kp.Stop(); err != nil {
		t.Fatalf("stop kube-proxy: %v", err)
	}
	stopped := time.Now()
	c.deleteService(t, migrationGoneAtTakeover)
	c.weir = runWeir(t, c.topo.Node, migrationNode, c.weirArgs(t, "run", "--takeover")...)
	c.weir.waitLog(t, "Took over from kube-proxy")
	tookOver := time.Now()
	c.waitWeirSynced(t)
	tr.setPhase("Weir")
	t.Logf("switch 1: kube-proxy stopped in %v; Weir, started then, took over %v after that",
		stopped.Sub(begin).Round(time.Millisecond), tookOver.Sub(stopped).Round(time.Millisecond))
	if c.mode.mode == "iptables" {
		c.weir.waitLog(t, "Using iptables")
		if want := "flavour=" + c.mode.flavour; !strings.Contains(c.weir.out.String(), want) {
			t.Errorf("Weir's iptables.backend auto did not pick kube-proxy's flavour (%s):\n%s", want, c.weir.out)
		}
	}
	tr.waitExchange(t, "after the takeover")
	c.verifyWeir(t)
	r := readMigrationRules(t, c.topo.Node)
	if left := r.kubeProxyLeft(c.mode.mode); len(left) > 0 {
		t.Errorf("after the takeover kube-proxy's rules are left: %s", strings.Join(left, "; "))
	}
}

// waitCanaries waits until kube-proxy's iptables mode has made its canary
// chains in the IPv4 mangle, nat and filter tables of its flavour, which
// the takeover must remove (see kubeProxyLeft).
func (c *migrationCluster) waitCanaries(t *testing.T) {
	t.Helper()
	tool := "iptables-" + c.mode.flavour
	want := []string{tool + " mangle", tool + " nat", tool + " filter"}
	poll(t, 10*time.Second, "kube-proxy's canary chains in "+strings.Join(want, ", "), func() bool {
		have := readMigrationRules(t, c.topo.Node).canaries()
		return !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(have, w) })
	})
}

// waitWeirSynced waits until Weir's metrics show a successful sync.
func (c *migrationCluster) waitWeirSynced(t *testing.T) {
	t.Helper()
	url := "http://" + c.weir.serving(t, "metricsBindAddress") + "/metrics"
	client := c.topo.Node.HTTPClient(3 * time.Second)
	poll(t, 30*time.Second, "Weir's metrics to show its first sync", func() bool {
		s, err := kubeproxy.ScrapeURL(t.Context(), client, url)
		return err == nil && s.Families["IPv4"].Syncs > 0 && s.Families["IPv4"].LastSync > 0
	})
}

// verifyWeir runs `weir verify`, which exits 0 only when the kernel holds
// exactly the rules Weir plans for the cluster.
func (c *migrationCluster) verifyWeir(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := c.topo.Node.Command(ctx, weirBinary(t), c.weirArgs(t, "verify")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("weir verify while Weir serves: %v\n%s", err, out)
	}
}

// weirArgs are the arguments of the weir command cmd (run, verify,
// cleanup) for the node, in the test's mode, extra last.
func (c *migrationCluster) weirArgs(t *testing.T, cmd string, extra ...string) []string {
	t.Helper()
	args := weirArgs(t, c.cp, migrationNode, append([]string{"--mode", c.mode.mode}, extra...)...)
	args[0] = cmd
	return args
}

// handBack is switch 2: Weir stops, the Service migrationGoneAtHandBack
// is deleted (only Weir's rules know it), kube-proxy starts and syncs,
// both rule sets serve side by side for a second, then `weir cleanup
// --keep-kube-proxy` removes Weir's own rules. It checks that kube-proxy
// serves and that no rule of Weir's is left.
func (c *migrationCluster) handBack(t *testing.T, tr *migrationTraffic) {
	t.Helper()
	tr.setPhase("switch 2")
	begin := time.Now()
	c.weir.stop(t)
	c.deleteService(t, migrationGoneAtHandBack)
	kp := c.startKubeProxy(t)
	synced := time.Now()
	// Both rule sets serve until the cleanup: keep them side by side for
	// a while, the longest a hand-back by hand would leave them.
	tr.setPhase("both serve")
	tr.waitConnections(t, "both serve", migrationSteadyConns)
	tr.setPhase("hand-back cleanup")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cleanup := time.Now()
	cmd := c.topo.Node.Command(ctx, weirBinary(t), c.weirArgs(t, "cleanup", "--keep-kube-proxy")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("weir cleanup --keep-kube-proxy: %v\n%s", err, out)
	}
	t.Logf("switch 2: kube-proxy synced %v after Weir was told to stop; weir cleanup --keep-kube-proxy took %v:\n%s",
		synced.Sub(begin).Round(time.Millisecond), time.Since(cleanup).Round(time.Millisecond), out)
	tr.setPhase("kube-proxy again")
	tr.waitExchange(t, "after the hand-back")
	c.checkKubeProxyServes(t, kp)
	r := readMigrationRules(t, c.topo.Node)
	if left := r.weirLeft(c.mode.mode); len(left) > 0 {
		t.Errorf("after the hand-back Weir's rules are left: %s", strings.Join(left, "; "))
	}
}

// deleteService deletes the Service name of the test.
func (c *migrationCluster) deleteService(t *testing.T, name string) {
	t.Helper()
	if err := c.cp.Client.CoreV1().Services("default").Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete service %s: %v", name, err)
	}
}
