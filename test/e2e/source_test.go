//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/events"
	"github.com/weirproxy/weir/core/source/kubernetes"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// recorder is a source.Handler remembering what it was told.
type recorder struct {
	mu       sync.Mutex
	synced   bool
	services map[string]bool
	slices   map[string]*discoveryv1.EndpointSlice
	node     *corev1.Node
	deletes  []string
	cidrs    []netip.Prefix
}

func newRecorder() *recorder {
	return &recorder{services: map[string]bool{}, slices: map[string]*discoveryv1.EndpointSlice{}}
}

func (r *recorder) OnService(prev, cur *corev1.Service) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur == nil {
		r.deletes = append(r.deletes, "Service "+prev.Namespace+"/"+prev.Name)
		delete(r.services, prev.Namespace+"/"+prev.Name)
		return
	}
	r.services[cur.Namespace+"/"+cur.Name] = true
}

func (r *recorder) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur == nil {
		r.deletes = append(r.deletes, "EndpointSlice "+prev.Namespace+"/"+prev.Name)
		delete(r.slices, prev.Namespace+"/"+prev.Name)
		return
	}
	r.slices[cur.Namespace+"/"+cur.Name] = cur
}

func (r *recorder) OnNode(prev, cur *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.node = cur
}

func (r *recorder) OnServiceCIDRs(cidrs []netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cidrs = cidrs
}

func (r *recorder) OnSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced = true
}

// waitFor polls cond under the recorder's lock until it holds.
func (r *recorder) waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sliceLists reports whether some slice of service ns/name lists ip.
func (r *recorder) sliceLists(ns, name, ip string) bool {
	for _, s := range r.slices {
		if s.Namespace == ns && s.Labels[discoveryv1.LabelServiceName] == name {
			for _, e := range s.Endpoints {
				for _, a := range e.Addresses {
					if a == ip {
						return true
					}
				}
			}
		}
	}
	return false
}

// TestKubernetesSource runs the kubernetes source with Weir's own
// ServiceAccount, bound only by deploy/kubernetes's RBAC: it delivers
// Services, the EndpointSlice controller's slices and its Node, skips what
// kube-proxy skips, and survives an API server restart without a flush.
func TestKubernetesSource(t *testing.T) {
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	c := cp.Client
	const nodeName = "node-a"
	mustCreate(t, func() error {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName,
			Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, metav1.CreateOptions{})
		return err
	})
	createService(ctx, t, cp, "web", nil)
	createService(ctx, t, cp, "other-proxy", map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"})
	createReadyPod(ctx, t, cp, "web-0", "web", nodeName, "10.244.0.11")

	cfg, err := kubernetes.Config(cp.KubeconfigForServiceAccount(t, "kube-system", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := kubernetes.New(cfg, kubernetes.Options{NodeName: nodeName, Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, rec) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("source: %v", err)
		}
	})

	rec.waitFor(t, time.Minute, "the source never synced", func() bool { return rec.synced })
	rec.waitFor(t, time.Minute, "web's slice never listed 10.244.0.11", func() bool { return rec.sliceLists("default", "web", "10.244.0.11") })
	rec.mu.Lock()
	if rec.node == nil || rec.node.Name != nodeName || rec.node.Labels[corev1.LabelTopologyZone] != "zone-a" {
		t.Errorf("node: got %+v, want %s with its zone", rec.node, nodeName)
	}
	if !rec.services["default/web"] || rec.services["default/other-proxy"] {
		t.Errorf("services %v: want default/web and not the other proxy's", rec.services)
	}
	rec.mu.Unlock()

	// The ranges of the ServiceCIDR objects: the API server's own, then
	// one more.
	cidrsAre := func(want ...string) func() bool {
		return func() bool {
			got := make([]string, len(rec.cidrs))
			for i, c := range rec.cidrs {
				got[i] = c.String()
			}
			return slices.Equal(got, want)
		}
	}
	rec.waitFor(t, time.Minute, "the source never delivered the API server's ServiceCIDR", cidrsAre(strings.Split(controlplane.ServiceCIDRs, ",")...))
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}}}
	mustCreate(t, func() error {
		_, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{})
		return err
	})
	rec.waitFor(t, time.Minute, "the source never delivered a new ServiceCIDR", cidrsAre("10.96.0.0/16", "10.97.0.0/24", "fd00:10:96::/112"))

	cp.RestartAPIServer(t)
	createService(ctx, t, cp, "after-restart", nil)
	createReadyPod(ctx, t, cp, "after-0", "after-restart", nodeName, "10.244.0.12")
	rec.waitFor(t, 2*time.Minute, "the source missed a Service created after the API server restarted", func() bool {
		return rec.services["default/after-restart"] && rec.sliceLists("default", "after-restart", "10.244.0.12")
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.deletes) > 0 || !rec.services["default/web"] {
		t.Errorf("the restart flushed objects: deletes %v, services %v", rec.deletes, rec.services)
	}
}

// TestNodeEvents posts Weir's Events about its Node with Weir's own
// ServiceAccount (deploy's RBAC grants Events, and nothing to write
// besides) and finds them on the API server.
func TestNodeEvents(t *testing.T) {
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	cfg, err := controlplane.ConfigFromKubeconfig(cp.KubeconfigForServiceAccount(t, "kube-system", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetesClient(t, cfg)
	r, stop := events.Start(sa, "node-a")
	defer stop()
	r.PluginQuarantined("canary", true)
	for range events.FailuresBeforeEvent {
		r.CommitFailed()
	}
	want := []string{events.ReasonPluginQuarantined, events.ReasonSyncFailing}
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := cp.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=node-a"})
		var got []string
		if err == nil {
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "Node" && e.Source.Component == "weir" {
					got = append(got, e.Reason)
				}
			}
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events on node-a: %v (list error %v), want %v", got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = sa.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("weir's ServiceAccount may list ConfigMaps (%v); RBAC grants too much", err)
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// createService creates a ClusterIP Service in default selecting app=name,
// port 80 to 8080.
func createService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name string, labels map[string]string) {
	t.Helper()
	svc := serviceObject(name, labels)
	if _, err := cp.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service %s: %v", name, err)
	}
}

// createReadyPod creates a Pod of app on node and reports it ready with ip,
// as a kubelet would.
func createReadyPod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name, app, node, ip string) {
	t.Helper()
	if err := readyPod(ctx, cp, name, app, node, ip); err != nil {
		t.Fatal(fmt.Errorf("pod %s: %w", name, err))
	}
}
