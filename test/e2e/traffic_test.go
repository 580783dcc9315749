//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// trafficNode is the Node the single-node test's Weir runs as.
const trafficNode = "node-a"

// webPods are the netns pods behind the Service web.
var webPods = []netns.PodSpec{
	{Name: "web-0", IP: netip.MustParseAddr("10.244.0.11"), Ports: []uint16{podPort}},
	{Name: "web-1", IP: netip.MustParseAddr("10.244.0.12"), Ports: []uint16{podPort}},
	{Name: "web-2", IP: netip.MustParseAddr("10.244.0.13"), Ports: []uint16{podPort}},
}

// programmingLimit bounds how long an API change may take to reach the
// datapath.
const programmingLimit = 15 * time.Second

// TestWeirServesTraffic runs `weir run` with the kubernetes source in a
// node namespace against the real control plane, as Weir's own
// ServiceAccount, and follows Services and Pods through the real
// EndpointSlice controller to real TCP connections from a client
// namespace:
//
//  1. a NodePort Service over three ready Pods answers on its cluster IP
//     and its node port, from all three, with the node port masqueraded;
//  2. a Pod deleted (left terminating, as without a kubelet) and a Pod
//     marked not ready stop getting connections, each within
//     programmingLimit; the latencies are logged next to Weir's
//     kubeproxy_network_programming_duration_seconds;
//  3. while kube-apiserver is down the rules keep serving; once it is back
//     a Service created afterwards gets traffic.
func TestWeirServesTraffic(t *testing.T) {
	c := startTrafficCluster(t)
	waitSet(t, c.weir, c.topo.Client, c.vip, programmingLimit, "web-0", "web-1", "web-2")
	if a, err := dial(c.topo.Client, c.nodePort, 3*time.Second); err != nil || a.Source.Addr() != c.topo.NodeIP {
		t.Errorf("node port %s: answer %v, %v; want the source masqueraded to %s", c.nodePort, a, err, c.topo.NodeIP)
	}
	t.Run("diagnose", c.diagnose)
	if t.Run("scale down", c.scaleDown) {
		t.Run("API server outage", c.outage)
	}
}

// trafficCluster is the single-node cluster of TestWeirServesTraffic.
type trafficCluster struct {
	cp       *controlplane.ControlPlane
	topo     *netns.Topology
	weir     *weirDaemon
	metrics  *http.Client // in the node, for Weir's metrics server
	vip      netip.AddrPort
	nodePort netip.AddrPort
}

// startTrafficCluster creates the NodePort Service web over the three
// ready webPods, starts Weir and waits until the cluster IP is served by
// all three.
func startTrafficCluster(t *testing.T) *trafficCluster {
	netns.RequireRoot(t)
	weirBinary(t) // build before the control plane's clock starts
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	c := &trafficCluster{cp: cp, topo: netns.NewT(t, netns.Options{Pods: webPods})}
	createNode(ctx, t, cp, trafficNode, c.topo.NodeIP)
	svc := serviceObject("web", nil)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc = createSvc(ctx, t, cp, svc)
	for _, p := range webPods {
		createReadyPod(ctx, t, cp, p.Name, "web", trafficNode, p.IP.String())
	}
	c.vip = clusterIP(t, svc)
	c.nodePort = netip.AddrPortFrom(c.topo.NodeIP, uint16(svc.Spec.Ports[0].NodePort))

	c.weir = startWeir(t, cp, c.topo.Node, trafficNode)
	begin := time.Now()
	c.metrics = c.topo.Node.HTTPClient(3 * time.Second)
	waitSet(t, c.weir, c.topo.Client, c.vip, time.Minute, "web-0", "web-1", "web-2")
	t.Logf("cluster IP %s served by web-0..2 %v after weir run was started", c.vip, time.Since(begin).Round(time.Millisecond))
	return c
}

// scaleDown deletes web-1 (left terminating, as without a kubelet) and
// marks web-2 not ready; each must stop getting connections within
// programmingLimit.
func (c *trafficCluster) scaleDown(t *testing.T) {
	ctx := t.Context()
	metrics := c.weir.serving(t, "metricsBindAddress")
	before := scrapeProgramming(t, c.metrics, metrics)
	sw := watchSlice(t, c.cp, "web", func(s *discoveryv1.EndpointSlice) bool { return endpointReady(s, "10.244.0.12", false) })
	change := time.Now()
	if err := c.cp.Client.CoreV1().Pods("default").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	served := waitSet(t, c.weir, c.topo.Client, c.vip, programmingLimit, "web-0", "web-2")
	t.Logf("pod web-1 deleted at %s (left terminating): the cluster IP stopped reaching it after %s",
		clock(change), breakdown(change, sw.wait(time.Second), served))

	mid := scrapeProgramming(t, c.metrics, metrics)
	sw = watchSlice(t, c.cp, "web", func(s *discoveryv1.EndpointSlice) bool { return endpointReady(s, "10.244.0.13", false) })
	change = time.Now()
	markNotReady(ctx, t, c.cp, "web-2")
	served = waitSet(t, c.weir, c.topo.Client, c.vip, programmingLimit, "web-0")
	t.Logf("pod web-2 marked not ready at %s: the cluster IP stopped reaching it after %s",
		clock(change), breakdown(change, sw.wait(time.Second), served))
	waitSet(t, c.weir, c.topo.Client, c.nodePort, programmingLimit, "web-0")

	after := scrapeProgramming(t, c.metrics, metrics)
	t.Logf("Weir's kubeproxy_network_programming_duration_seconds: after the delete %s; after not ready %s",
		mid.since(before), after.since(mid))
	if after.count <= before.count {
		t.Errorf("kubeproxy_network_programming_duration_seconds_count stayed at %d over two slice changes", after.count)
	}
}

// outage stops kube-apiserver: the rules keep serving while it is down;
// once it is back, a Service created afterwards gets traffic and the old
// one still does.
func (c *trafficCluster) outage(t *testing.T) {
	ctx := t.Context()
	down := time.Now()
	c.cp.StopAPIServer(t)
	n := keepServing(t, c.weir, c.topo.Client, c.vip, 3*time.Second, "web-0")
	t.Logf("kube-apiserver stopped at %s: %d connections in the next 3s all reached web-0", clock(down), n)
	c.cp.StartAPIServer(t)

	late := netns.PodSpec{Name: "late-0", IP: netip.MustParseAddr("10.244.0.21"), Ports: []uint16{podPort}}
	if _, err := c.topo.AddPod(late); err != nil {
		t.Fatal(err)
	}
	sw := watchSlice(t, c.cp, "late", func(s *discoveryv1.EndpointSlice) bool { return endpointReady(s, late.IP.String(), true) })
	change := time.Now()
	svc := createSvc(ctx, t, c.cp, serviceObject("late", nil))
	createReadyPod(ctx, t, c.cp, late.Name, "late", trafficNode, late.IP.String())
	served := waitSet(t, c.weir, c.topo.Client, clusterIP(t, svc), time.Minute, late.Name)
	t.Logf("Service late created at %s, after the API server came back: served after %s",
		clock(change), breakdown(change, sw.wait(time.Second), served))
	waitSet(t, c.weir, c.topo.Client, c.vip, programmingLimit, "web-0")
}

// clock formats t as Weir's log does, to line test events up with it.
func clock(t time.Time) string {
	return t.UTC().Format("15:04:05.000")
}

// markNotReady patches pod's status not ready, as a kubelet whose
// readiness probe fails would.
func markNotReady(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, pod string) {
	t.Helper()
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, LastTransitionTime: now},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cp.Client.CoreV1().Pods("default").Patch(ctx, pod, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("mark %s not ready: %v", pod, err)
	}
}
