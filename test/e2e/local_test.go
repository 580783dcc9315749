//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// The two-node cluster: each node is its own netns topology with its own
// client, and only node-a has a pod. Node-b's client link uses another
// subnet so that the two nodes' addresses differ, as in one cluster.
// Node-b reaches that pod's IP as over a cluster's pod network: its own
// topology has a stand-in pod with the same address, remote-0, so that a
// connection node-b forwards to the pod is answered rather than lost.
var (
	localPod      = netns.PodSpec{Name: "local-0", IP: netip.MustParseAddr("10.244.0.11"), Ports: []uint16{podPort}}
	remotePod     = netns.PodSpec{Name: "remote-0", IP: localPod.IP, Ports: []uint16{podPort}}
	nodeBSubnet   = netip.MustParsePrefix("172.31.0.0/24")
	loadBalancer  = netip.MustParseAddr("203.0.113.10") // TEST-NET-3
	localEndpoint = regexp.MustCompile(`"localEndpoints":\s*(\d+)`)
)

// TestWeirExternalTrafficPolicyLocal runs one Weir per node, node-a and
// node-b, each in its own node namespace with its own --node-name, and a
// LoadBalancer Service with externalTrafficPolicy Local whose only pod runs
// on node-a. Node-a's health check node port answers 200 with one local
// endpoint and node-b's 503 with none; the node port and the load-balancer
// IP on node-a reach the pod with the client's own source address; once
// the pod is terminating, node-a's health check answers 503 while the pod
// still serves its node port; and the
// node port on node-b drops connections (times out, no reset or ICMP
// error).
func TestWeirExternalTrafficPolicyLocal(t *testing.T) {
	netns.RequireRoot(t)
	weirBinary(t)
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	topoA := netns.NewT(t, netns.Options{Pods: []netns.PodSpec{localPod}})
	topoB := netns.NewT(t, netns.Options{ClientSubnet: nodeBSubnet, Pods: []netns.PodSpec{remotePod}})
	createNode(ctx, t, cp, "node-a", topoA.NodeIP)
	createNode(ctx, t, cp, "node-b", topoB.NodeIP)

	svc := serviceObject("local", nil)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc = createSvc(ctx, t, cp, svc)
	setLoadBalancerIP(t, cp, svc.Name, loadBalancer)
	createReadyPod(ctx, t, cp, localPod.Name, "local", "node-a", localPod.IP.String())
	hc, np := uint16(svc.Spec.HealthCheckNodePort), uint16(svc.Spec.Ports[0].NodePort)
	if hc == 0 || np == 0 {
		t.Fatalf("service local: healthCheckNodePort %d, nodePort %d; want both allocated", hc, np)
	}
	t.Logf("node ports: traffic %d, health check %d", np, hc)

	dA := startWeir(t, cp, topoA.Node, "node-a")
	dB := startWeir(t, cp, topoB.Node, "node-b")
	waitHealth(t, dA, topoA.Client, netip.AddrPortFrom(topoA.NodeIP, hc), http.StatusOK, 1)
	waitHealth(t, dB, topoB.Client, netip.AddrPortFrom(topoB.NodeIP, hc), http.StatusServiceUnavailable, 0)

	for _, addr := range []netip.AddrPort{netip.AddrPortFrom(topoA.NodeIP, np), netip.AddrPortFrom(loadBalancer, 80)} {
		waitSet(t, dA, topoA.Client, addr, programmingLimit, localPod.Name)
		a, err := dial(topoA.Client, addr, 3*time.Second)
		if err != nil || a.Source.Addr() != topoA.ClientIP {
			t.Errorf("%s on node-a: answer %v, %v; want %s with the client's source %s kept", addr, a, err, localPod.Name, topoA.ClientIP)
		}
	}
	// Terminating, the pod still serves node-a's Local traffic as a
	// fallback, but like kube-proxy the health check counts only ready
	// endpoints: load balancers drain node-a during a rollout. With no
	// kubelet, the pod stays terminating.
	grace := int64(3600)
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, localPod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, dA, topoA.Client, netip.AddrPortFrom(topoA.NodeIP, hc), http.StatusServiceUnavailable, 0)
	waitSet(t, dA, topoA.Client, netip.AddrPortFrom(topoA.NodeIP, np), programmingLimit, localPod.Name)
	// Internal traffic still reaches the pod on the other node.
	waitSet(t, dB, topoB.Client, clusterIP(t, svc), programmingLimit, remotePod.Name)
	// Only once node-b's first sync is committed does a timeout prove a
	// drop rule: without rules, its kernel would refuse the node port, and
	// a rule sending external traffic to the remote pod would be answered.
	dB.waitLog(t, `msg="Synced rules" full=true`)
	wantDropped(t, dB, topoB.Client, netip.AddrPortFrom(topoB.NodeIP, np), netip.AddrPortFrom(loadBalancer, 80))

	// Switched to Cluster, node-b forwards external traffic to the pod too,
	// masqueraded: the drops above were the policy, not the topology.
	patch := []byte(`{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	if _, err := cp.Client.CoreV1().Services("default").Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	nodePortB := netip.AddrPortFrom(topoB.NodeIP, np)
	waitSet(t, dB, topoB.Client, nodePortB, programmingLimit, remotePod.Name)
	if a, err := dial(topoB.Client, nodePortB, 3*time.Second); err != nil || a.Source.Addr() != topoB.NodeIP {
		t.Errorf("%s on node-b with policy Cluster: answer %v, %v; want the source masqueraded to %s", nodePortB, a, err, topoB.NodeIP)
	}
	// The API server released the health check node port; Weir closes it.
	hcB := "http://" + netip.AddrPortFrom(topoB.NodeIP, hc).String() + "/"
	cB := topoB.Client.HTTPClient(3 * time.Second)
	poll(t, programmingLimit, "node-b to close the released health check node port", func() bool {
		_, _, err := get(cB, hcB)
		return errors.Is(err, syscall.ECONNREFUSED)
	})
}

// wantDropped makes three connections from ns to each of addrs at once and
// fails the test unless every one times out after a second: the node drops
// them, rather than refusing them or passing them on.
func wantDropped(t *testing.T, d *weirDaemon, ns *netns.Namespace, addrs ...netip.AddrPort) {
	t.Helper()
	d.mustRun(t)
	var wg sync.WaitGroup
	for _, addr := range addrs {
		for range 3 {
			wg.Go(func() {
				if a, err := dial(ns, addr, time.Second); !errors.Is(err, netns.ErrTimeout) {
					t.Errorf("%s on %s, which has no local endpoint: answer %v, %v; want the connection dropped (timeout)", addr, d.name, a, err)
				}
			})
		}
	}
	wg.Wait()
}

// setLoadBalancerIP writes ip into the Service's load-balancer status, as
// a cloud controller would.
func setLoadBalancerIP(t *testing.T, cp *controlplane.ControlPlane, name string, ip netip.Addr) {
	t.Helper()
	status := corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: ip.String()}}}}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cp.Client.CoreV1().Services("default").Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("set the load-balancer IP of %s: %v", name, err)
	}
}

// waitHealth polls the health check node port at addr from ns until it
// answers code with want local endpoints.
func waitHealth(t *testing.T, d *weirDaemon, ns *netns.Namespace, addr netip.AddrPort, code, want int) {
	t.Helper()
	c := ns.HTTPClient(3 * time.Second)
	var last string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		d.mustRun(t)
		got, body, err := get(c, "http://"+addr.String()+"/")
		if err != nil {
			last = err.Error()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		m := localEndpoint.FindStringSubmatch(body)
		if got == code && m != nil && m[1] == fmt.Sprint(want) {
			t.Logf("health check %s on %s: %d %s", addr, d.name, got, strings.Join(strings.Fields(body), " "))
			return
		}
		last = fmt.Sprintf("%d %s", got, body)
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("health check %s on %s: want %d with localEndpoints %d within 1m; last: %s", addr, d.name, code, want, last)
}
