package compare

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/scale"
)

// The namespaces the load lives in, and the Node both proxies run as.
const (
	loadNamespace  = "compare-load"
	probeNamespace = "compare-probe"
	nodeName       = "node-0"
)

// nodePorts is the size of the API server's default service-node-port-range
// (30000-32767), from which it allocates every node port and every
// health-check node port.
const nodePorts = 2768

// loadServices returns the Services of size: test/scale's mix (of every
// ten, five ClusterIP, one of them with ClientIP affinity, three NodePort,
// two LoadBalancer with an ingress IP and source ranges, one of them with
// externalTrafficPolicy Local), adapted to a real API server: the API
// server picks cluster IPs and node ports, and node ports run out where
// the API server's range does. test/scale stops giving node ports after
// 2700; here a NodePort or LoadBalancer service also needs one for each
// health check, so once the range is spent a NodePort service becomes
// ClusterIP, a LoadBalancer gets no node ports and a Local one becomes
// Cluster (it would need a health-check node port).
func loadServices(size Size) ([]*corev1.Service, error) {
	out := make([]*corev1.Service, size.Services)
	left := nodePorts
	for i := range out {
		svc, err := scaleService(i)
		if err != nil {
			return nil, err
		}
		left -= FitNodePorts(svc, left)
		out[i] = svc
	}
	return out, nil
}

// scaleService decodes service i of test/scale's manifests and clears what
// the API server allocates itself.
func scaleService(i int) (*corev1.Service, error) {
	doc, _, _ := strings.Cut(string(scale.Manifest(i, 1, 0)), "\n---\n")
	svc := &corev1.Service{}
	if err := yaml.UnmarshalStrict([]byte(doc), svc); err != nil {
		return nil, fmt.Errorf("test/scale service %d: %w", i, err)
	}
	svc.Namespace = loadNamespace
	svc.Spec.ClusterIP = ""
	for j := range svc.Spec.Ports {
		svc.Spec.Ports[j].NodePort = 0
	}
	return svc, nil
}

// FitNodePorts downgrades svc until the node ports it needs fit in left,
// and returns how many it needs.
func FitNodePorts(svc *corev1.Service, left int) int {
	need := nodePortsNeeded(svc)
	if need <= left {
		return need
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort:
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	case corev1.ServiceTypeLoadBalancer:
		off := false
		svc.Spec.AllocateLoadBalancerNodePorts = &off
		if nodePortsNeeded(svc) > left {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		}
	}
	return nodePortsNeeded(svc)
}

// nodePortsNeeded is how many node ports the API server allocates for svc.
func nodePortsNeeded(svc *corev1.Service) int {
	spec := svc.Spec
	n := 0
	switch {
	case spec.Type == corev1.ServiceTypeNodePort:
		n = len(spec.Ports)
	case spec.Type == corev1.ServiceTypeLoadBalancer && (spec.AllocateLoadBalancerNodePorts == nil || *spec.AllocateLoadBalancerNodePorts):
		n = len(spec.Ports)
	}
	if spec.Type == corev1.ServiceTypeLoadBalancer && spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		n++
	}
	return n
}

// endpointAddr is the address of endpoint j of service i: one of its own
// in 10.128.0.0/9. Version v > 0 moves endpoint 0 into 10.64.0.0/10, as
// test/scale's versions do, so successive versions are one-endpoint
// changes.
func endpointAddr(i, j, eps, v int) netip.Addr {
	if j == 0 && v > 0 {
		return offset(netip.MustParseAddr("10.64.0.0"), (i*64+v%64)%(1<<22))
	}
	return offset(netip.MustParseAddr("10.128.0.0"), (i*eps+j)%(1<<23))
}

// offset is a + n for an IPv4 address.
func offset(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// loadSlice is the EndpointSlice of service i at version v: eps ready
// endpoints on node-0, node-1 and node-2 in turn (a third local), port
// http 8080 as test/scale writes them. A hidden slice carries the label
// service.kubernetes.io/headless, which both proxies' informers leave out.
func loadSlice(i, eps, v int, hidden bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%d-abcde", i), Namespace: loadNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{slicePort(8080)},
	}
	if hidden {
		s.Labels[corev1.IsHeadlessService] = ""
	}
	ready := true
	s.Endpoints = make([]discoveryv1.Endpoint, eps)
	for j := range s.Endpoints {
		node := fmt.Sprintf("node-%d", j%3)
		s.Endpoints[j] = discoveryv1.Endpoint{
			Addresses:  []string{endpointAddr(i, j, eps, v).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		}
	}
	return s
}

// slicePort is the EndpointSlice port "http" of every service here.
func slicePort(port int32) discoveryv1.EndpointPort {
	name, proto := "http", corev1.ProtocolTCP
	return discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto}
}

// writer writes the load through the API with parallel workers.
type writer struct {
	client  kubernetes.Interface
	workers int
}

// each runs fn for 0..n-1 on w.workers goroutines; the first error stops
// the others and is returned.
func (w *writer) each(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(w.workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// createOne writes one Service (and its status, if it has one) and its
// EndpointSlice; it returns the number of writes.
func (w *writer) createOne(ctx context.Context, svc *corev1.Service, slice *discoveryv1.EndpointSlice) (int, error) {
	var created *corev1.Service
	err := retry(ctx, func() (err error) {
		created, err = w.client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt got through
			created, err = w.client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	writes := 1
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		created.Status = svc.Status
		err := retry(ctx, func() error {
			_, err := w.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return writes, fmt.Errorf("load balancer status of %s: %w", svc.Name, err)
		}
		writes++
	}
	if err := w.putSlice(ctx, slice, true); err != nil {
		return writes, err
	}
	return writes + 1, nil
}

// putSlice creates or updates an EndpointSlice (updates need no
// resourceVersion: EndpointSlices allow unconditional updates).
func (w *writer) putSlice(ctx context.Context, s *discoveryv1.EndpointSlice, create bool) error {
	err := retry(ctx, func() error {
		api := w.client.DiscoveryV1().EndpointSlices(s.Namespace)
		var err error
		if create {
			if _, err = api.Create(ctx, s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				create, err = false, nil
			}
			return err
		}
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("write endpointslice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// retry runs fn until it succeeds, fails with an error a retry cannot
// fix, or fails five times; between tries it waits 100 ms, doubling.
func retry(ctx context.Context, fn func() error) error {
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := fn()
		if err == nil || try == 5 || !retriable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// retriable reports whether err is the API server being busy or slow.
func retriable(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsConflict(err)
}

// createNode creates the Node both proxies run as, with the node
// namespace's address (the same in every fresh topology); a Node keeps the
// status it is created with.
func createNode(ctx context.Context, client kubernetes.Interface, ip netip.Addr) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}},
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", nodeName, err)
	}
	return nil
}

// createNamespaces creates the namespaces of the load and of the probes.
func createNamespaces(ctx context.Context, client kubernetes.Interface) error {
	for _, name := range []string{loadNamespace, probeNamespace} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", name, err)
		}
	}
	return nil
}
