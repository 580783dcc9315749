//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weirproxy/weir/test/conformance"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/kubeproxy"
	"github.com/weirproxy/weir/test/netns"
)

// oracleModes are the kube-proxy modes the conformance table runs against,
// with the iptables flavour of mode iptables (Debian's default, and what
// kube-proxy's image picks on a node without legacy rules).
var oracleModes = []struct{ mode, flavour string }{{"nftables", ""}, {"iptables", "nft"}}

// oracleTimeout bounds kube-proxy's start and each wait for it to commit.
const oracleTimeout = time.Minute

// TestKubeProxyConformance runs the kernel conformance table (the rows
// every Weir backend passes, test/conformance) against the real kube-proxy
// v1.37, in nftables and in iptables mode: each row's objects written
// through the API of one real control plane, kube-proxy run as node-a in
// the row's node namespace, and the same probes. A row's expectation that
// kube-proxy does not meet must be a deliberate difference of Weir's,
// marked in the row (Probe.Differs) and explained in docs/semantics.md;
// the run checks kube-proxy against the difference instead.
func TestKubeProxyConformance(t *testing.T) {
	netns.RequireRoot(t)
	bins := controlplane.RequireBinaries(t)
	cp := controlplane.Start(t)
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = 200, 400
	rc.WarningHandler = rest.NoWarnings{} // externalIPs are deprecated, and used on purpose
	client := kubernetesClient(t, rc)
	for _, m := range oracleModes {
		t.Run(m.mode, func(t *testing.T) {
			conformance.RunExternal(t, conformance.Rows(), &oracleProxy{
				cp: cp, client: client, binary: bins.KubeProxy, mode: m.mode, flavour: m.flavour,
			})
		})
	}
}

// oracleProxy is kube-proxy as a conformance.External: it writes a row's
// objects through the API and runs kube-proxy in the row's node.
type oracleProxy struct {
	cp      *controlplane.ControlPlane
	client  kubernetes.Interface
	binary  string
	mode    string
	flavour string

	proc *kubeproxy.Process
	live map[string]runtime.Object // the API's copies, by oracleKey
}

// Name names kube-proxy and its mode, as Differences do.
func (o *oracleProxy) Name() string { return "kube-proxy/" + o.mode }

// Start writes objs, starts kube-proxy and waits for its first sync.
func (o *oracleProxy) Start(t *testing.T, topo *netns.Topology, opts conformance.Options, objs []runtime.Object) {
	t.Helper()
	ctx := t.Context()
	o.live = map[string]runtime.Object{}
	// Registered first, so it runs last: after kube-proxy stopped (a
	// deleted Node makes it exit).
	t.Cleanup(func() { o.clear(t) })
	for _, obj := range objs {
		if _, err := o.write(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	forwardAPIServer(t, o.cp, topo.Node)
	p, err := kubeproxy.Start(topo.Node, o.binary, t.TempDir(), kubeproxy.Config{
		Mode: o.mode, Flavour: o.flavour, NodeName: conformance.NodeName, Kubeconfig: o.cp.Kubeconfig,
		ClusterCIDRs: opts.ClusterCIDRs, MasqueradeAll: opts.MasqueradeAll,
	})
	if err != nil {
		t.Fatal(err)
	}
	o.proc = p
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop kube-proxy: %v", err)
		}
		if t.Failed() {
			t.Logf("kube-proxy's log:\n%s", p.Log())
		}
	})
	wctx, cancel := context.WithTimeout(ctx, oracleTimeout)
	defer cancel()
	if err := p.WaitFirstSync(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy (%s) synced %v after its start", o.mode, time.Since(p.Started).Round(time.Millisecond))
}

// Change writes apply, deletes del and waits until kube-proxy has
// committed every event they caused.
func (o *oracleProxy) Change(t *testing.T, apply, del []runtime.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), oracleTimeout)
	defer cancel()
	mark, err := o.proc.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want kubeproxy.Changes
	for _, obj := range apply {
		c, err := o.write(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		want = oracleAdd(want, c)
	}
	for _, obj := range del {
		c, err := o.delete(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		want = oracleAdd(want, c)
	}
	if err := o.proc.WaitSettled(ctx, mark, want); err != nil {
		t.Fatal(err)
	}
}

func oracleAdd(a, b kubeproxy.Changes) kubeproxy.Changes {
	return kubeproxy.Changes{Services: a.Services + b.Services, Slices: a.Slices + b.Slices, Node: a.Node || b.Node}
}

// write creates obj, or updates the live object of its key, status
// included, and returns the events kube-proxy gets from it.
func (o *oracleProxy) write(ctx context.Context, obj runtime.Object) (kubeproxy.Changes, error) {
	key := oracleKey(obj)
	prev := o.live[key]
	var cur runtime.Object
	var err error
	switch obj := obj.(type) {
	case *corev1.Service:
		cur, err = o.writeService(ctx, obj, prev)
	case *discoveryv1.EndpointSlice:
		cur, err = o.writeSlice(ctx, obj, prev)
	case *corev1.Node:
		cur, err = o.writeNode(ctx, obj, prev)
	default:
		err = fmt.Errorf("unexpected object %T", obj)
	}
	if err != nil {
		return kubeproxy.Changes{}, fmt.Errorf("write %s: %w", key, err)
	}
	o.live[key] = cur
	return oracleEvents(prev, cur), nil
}

func (o *oracleProxy) writeService(ctx context.Context, svc *corev1.Service, prev runtime.Object) (runtime.Object, error) {
	api := o.client.CoreV1().Services(svc.Namespace)
	svc = svc.DeepCopy()
	status := svc.Status
	var cur *corev1.Service
	var err error
	if prev == nil {
		cur, err = api.Create(ctx, svc, metav1.CreateOptions{})
	} else {
		svc.ResourceVersion = prev.(*corev1.Service).ResourceVersion
		cur, err = api.Update(ctx, svc, metav1.UpdateOptions{})
	}
	if err != nil || reflect.DeepEqual(cur.Status, status) {
		return cur, err
	}
	cur.Status = status
	return api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
}

func (o *oracleProxy) writeSlice(ctx context.Context, s *discoveryv1.EndpointSlice, prev runtime.Object) (runtime.Object, error) {
	api := o.client.DiscoveryV1().EndpointSlices(s.Namespace)
	s = s.DeepCopy()
	if prev == nil {
		return api.Create(ctx, s, metav1.CreateOptions{})
	}
	s.ResourceVersion = prev.(*discoveryv1.EndpointSlice).ResourceVersion
	return api.Update(ctx, s, metav1.UpdateOptions{})
}

func (o *oracleProxy) writeNode(ctx context.Context, n *corev1.Node, prev runtime.Object) (runtime.Object, error) {
	api := o.client.CoreV1().Nodes()
	n = n.DeepCopy()
	if prev == nil {
		return api.Create(ctx, n, metav1.CreateOptions{}) // a Node's status is kept on create
	}
	status := n.Status
	n.ResourceVersion = prev.(*corev1.Node).ResourceVersion
	cur, err := api.Update(ctx, n, metav1.UpdateOptions{})
	if err != nil || reflect.DeepEqual(cur.Status.Addresses, status.Addresses) {
		return cur, err
	}
	cur.Status = status
	return api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
}

// delete deletes obj's live object and returns the events kube-proxy gets.
func (o *oracleProxy) delete(ctx context.Context, obj runtime.Object) (kubeproxy.Changes, error) {
	key := oracleKey(obj)
	prev := o.live[key]
	m := oracleMeta(obj)
	var err error
	switch obj.(type) {
	case *corev1.Service:
		err = o.client.CoreV1().Services(m.Namespace).Delete(ctx, m.Name, metav1.DeleteOptions{})
	case *discoveryv1.EndpointSlice:
		err = o.client.DiscoveryV1().EndpointSlices(m.Namespace).Delete(ctx, m.Name, metav1.DeleteOptions{})
	case *corev1.Node:
		err = o.client.CoreV1().Nodes().Delete(ctx, m.Name, metav1.DeleteOptions{})
	}
	if err != nil {
		return kubeproxy.Changes{}, fmt.Errorf("delete %s: %w", key, err)
	}
	delete(o.live, key)
	return oracleEvents(prev, nil), nil
}

// clear deletes every live object and waits until the API has none of
// them, so that the next row can take the same names and cluster IPs.
func (o *oracleProxy) clear(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), oracleTimeout)
	defer cancel()
	for _, obj := range o.live {
		if _, err := o.delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("clean up: %v", err)
		}
	}
	poll(t, oracleTimeout, "the row's Services to be gone", func() bool {
		l, err := o.client.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) <= 1 // the kubernetes Service stays
	})
}

// oracleEvents is what kube-proxy's informers deliver for a write that turned
// prev into cur (either nil for a creation or deletion): one Service or
// EndpointSlice event when kube-proxy watches the object before or after
// and it changed, as its change counters count them; for this node's Node,
// whether its zone label, which kube-proxy acts on, changed.
func oracleEvents(prev, cur runtime.Object) kubeproxy.Changes {
	obj := cur
	if obj == nil {
		obj = prev
	}
	if prev != nil && cur != nil && oracleMeta(prev).ResourceVersion == oracleMeta(cur).ResourceVersion {
		return kubeproxy.Changes{}
	}
	if !oracleWatched(prev) && !oracleWatched(cur) {
		return kubeproxy.Changes{}
	}
	switch obj := obj.(type) {
	case *corev1.Service:
		return kubeproxy.Changes{Services: 1}
	case *discoveryv1.EndpointSlice:
		if obj.AddressType == discoveryv1.AddressTypeFQDN {
			return kubeproxy.Changes{}
		}
		return kubeproxy.Changes{Slices: 1}
	}
	return kubeproxy.Changes{Node: oracleZone(prev) != oracleZone(cur)}
}

// oracleWatched reports whether kube-proxy's informers see obj: Services
// without the service-proxy-name label and not headless, EndpointSlices
// without the headless label (cmd/kube-proxy/app/server.go), and the Node.
func oracleWatched(obj runtime.Object) bool {
	switch o := obj.(type) {
	case *corev1.Service:
		_, other := o.Labels["service.kubernetes.io/service-proxy-name"]
		return !other && o.Spec.ClusterIP != corev1.ClusterIPNone
	case *discoveryv1.EndpointSlice:
		_, headless := o.Labels[corev1.IsHeadlessService]
		return !headless
	}
	return obj != nil
}

func oracleZone(obj runtime.Object) string {
	if obj == nil {
		return ""
	}
	return oracleMeta(obj).Labels[corev1.LabelTopologyZone]
}

// oracleMeta returns obj's object metadata.
func oracleMeta(obj runtime.Object) *metav1.ObjectMeta {
	switch o := obj.(type) {
	case *corev1.Service:
		return &o.ObjectMeta
	case *discoveryv1.EndpointSlice:
		return &o.ObjectMeta
	case *corev1.Node:
		return &o.ObjectMeta
	}
	panic(fmt.Sprintf("unexpected object %T", obj))
}

// oracleKey names obj as "Kind namespace/name".
func oracleKey(obj runtime.Object) string {
	m := oracleMeta(obj)
	return fmt.Sprintf("%T %s/%s", obj, m.Namespace, m.Name)
}
