//go:build e2e

// Package e2e holds Weir's end-to-end tests against a real control plane
// (test/e2e/controlplane). They build only with the e2e tag: `make e2e`.
package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sliceTimeout bounds the wait for the EndpointSlice controller.
const sliceTimeout = time.Minute

// TestControlPlaneEndpointSlice is the control plane's smoke test: a Service
// with a selector and a ready Pod bound to a Node make the real EndpointSlice
// controller write a slice listing the Pod's address as ready.
func TestControlPlaneEndpointSlice(t *testing.T) {
	begin := time.Now()
	cp := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := cp.Client
	const ns, podIP = "default", "10.244.0.11"

	// The controller skips Pods whose Node it does not know.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	svc, err := c.CoreV1().Services(ns).Create(ctx, serviceObject("web", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	t.Logf("service %s/%s has cluster IPs %v", ns, svc.Name, svc.Spec.ClusterIPs)
	if err := readyPod(ctx, cp, "web-0", "web", node.Name, podIP); err != nil {
		t.Fatalf("pod: %v", err)
	}

	waitStart := time.Now()
	slice := waitForSlice(ctx, t, cp, ns, svc.Name, func(s *discoveryv1.EndpointSlice) bool {
		return slices.ContainsFunc(s.Endpoints, func(e discoveryv1.Endpoint) bool {
			return slices.Contains(e.Addresses, podIP) && e.Conditions.Ready != nil && *e.Conditions.Ready
		})
	})
	t.Logf("EndpointSlice %s lists %s as ready %v after the pod became ready; test took %v",
		slice.Name, podIP, time.Since(waitStart).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	if len(slice.Ports) != 1 || slice.Ports[0].Port == nil || *slice.Ports[0].Port != 8080 {
		t.Errorf("slice ports = %+v, want one port 8080", slice.Ports)
	}
}

// waitForSlice polls the EndpointSlices of the Service ns/name until one
// satisfies ok, and fails t at ctx's deadline or sliceTimeout.
func waitForSlice(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, name string, ok func(*discoveryv1.EndpointSlice) bool) *discoveryv1.EndpointSlice {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, sliceTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	sel := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name}
	var last []discoveryv1.EndpointSlice
	for {
		list, err := cp.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, sel)
		if err == nil {
			last = list.Items
			for i := range list.Items {
				if ok(&list.Items[i]) {
					return &list.Items[i]
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no matching EndpointSlice for %s/%s (last list error: %v); slices: %+v", ns, name, err, last)
		case <-tick.C:
		}
	}
}
