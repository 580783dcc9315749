package soak

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/weirproxy/weir/test/netns"
)

// managedBy marks the soak's EndpointSlices; the EndpointSlice controller
// leaves them alone (and the soak's Services have no selector anyway).
const managedBy = "soak.weir.dev"

// store writes the model's objects where Weir's source reads them: the
// API server (apiStore) or a folder of manifests (filesStore). Each
// method updates the model's stored object and lastWrite.
type store interface {
	createService(ctx context.Context, s *service) error
	// updateService writes the service's spec and load-balancer status.
	updateService(ctx context.Context, s *service) error
	// deleteService deletes the service and its slices.
	deleteService(ctx context.Context, s *service) error
	createSlice(ctx context.Context, s *service, sl *slice) error
	updateSlice(ctx context.Context, s *service, sl *slice) error
	deleteSlice(ctx context.Context, s *service, sl *slice) error
	// purge deletes the service and every slice labelled with its name,
	// whatever the model says, after a write failed.
	purge(ctx context.Context, s *service) error
	// writeCount is how many writes were made.
	writeCount() int
}

// apiStore stores the model's objects through the API.
type apiStore struct {
	client kubernetes.Interface
	pods   []*netns.Pod
	writes int
}

func (w *apiStore) writeCount() int { return w.writes }

func (w *apiStore) purge(ctx context.Context, s *service) error {
	err := w.client.CoreV1().Services(s.ns).Delete(ctx, s.name, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		err = w.client.DiscoveryV1().EndpointSlices(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.name})
	}
	w.writes++
	return err
}

// applySpec copies the model's spec into obj, keeping what the API server
// allocated (cluster IPs, node ports of unchanged ports).
func (s *service) applySpec(obj *corev1.Service) {
	obj.Annotations = maps.Clone(s.annotations)
	spec := &obj.Spec
	spec.Type = s.kind
	ports := make([]corev1.ServicePort, 0, len(s.ports))
	for _, p := range s.ports {
		sp := corev1.ServicePort{Name: p.name, Protocol: p.proto, Port: p.port, TargetPort: intstr.FromInt32(p.targetPort())}
		for _, old := range spec.Ports {
			if old.Name == p.name && old.Protocol == p.proto && s.kind != corev1.ServiceTypeClusterIP {
				sp.NodePort = old.NodePort
			}
		}
		ports = append(ports, sp)
	}
	spec.Ports = ports
	policy := corev1.IPFamilyPolicySingleStack
	if s.dual {
		policy = corev1.IPFamilyPolicyPreferDualStack
	}
	spec.IPFamilyPolicy = &policy
	itp := corev1.ServiceInternalTrafficPolicyCluster
	if s.itpLocal {
		itp = corev1.ServiceInternalTrafficPolicyLocal
	}
	spec.InternalTrafficPolicy = &itp
	spec.ExternalTrafficPolicy = ""
	if s.kind != corev1.ServiceTypeClusterIP {
		spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if s.etpLocal {
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
	}
	if s.kind != corev1.ServiceTypeLoadBalancer || !s.etpLocal {
		spec.HealthCheckNodePort = 0 // the API server allocates one when it is needed
	}
	spec.SessionAffinity, spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
	if s.affinity > 0 {
		t := s.affinity
		spec.SessionAffinity = corev1.ServiceAffinityClientIP
		spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	spec.ExternalIPs = nil
	for _, ip := range s.externalIPs {
		spec.ExternalIPs = append(spec.ExternalIPs, ip.String())
	}
}

// createService creates s and its slices.
func (w *apiStore) createService(ctx context.Context, s *service) error {
	obj := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns}}
	s.applySpec(obj)
	out, err := w.client.CoreV1().Services(s.ns).Create(ctx, obj, metav1.CreateOptions{})
	w.writes++
	if err != nil {
		return fmt.Errorf("create service %s: %w", s.key(), err)
	}
	s.obj = out
	s.lastWrite = time.Now()
	if err := w.writeLBStatus(ctx, s); err != nil {
		return err
	}
	for _, sl := range s.slices {
		if err := w.createSlice(ctx, s, sl); err != nil {
			return err
		}
	}
	return nil
}

// updateService writes the model's spec of s over the stored object,
// reading it again when it changed meanwhile.
func (w *apiStore) updateService(ctx context.Context, s *service) error {
	svcs := w.client.CoreV1().Services(s.ns)
	leavingLB := s.obj.Spec.Type == corev1.ServiceTypeLoadBalancer && s.kind != corev1.ServiceTypeLoadBalancer
	if leavingLB && len(s.obj.Status.LoadBalancer.Ingress) > 0 {
		// As a cloud controller would, before the type changes.
		obj := s.obj.DeepCopy()
		obj.Status.LoadBalancer = corev1.LoadBalancerStatus{}
		out, err := svcs.UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		w.writes++
		if err != nil {
			return fmt.Errorf("clear the load balancer of %s: %w", s.key(), err)
		}
		s.obj = out
	}
	for attempt := 0; ; attempt++ {
		obj := s.obj.DeepCopy()
		s.applySpec(obj)
		out, err := svcs.Update(ctx, obj, metav1.UpdateOptions{})
		w.writes++
		if apierrors.IsConflict(err) && attempt < 3 {
			if s.obj, err = svcs.Get(ctx, s.name, metav1.GetOptions{}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("update service %s: %w", s.key(), err)
		}
		s.obj = out
		break
	}
	s.lastWrite = time.Now()
	return w.writeLBStatus(ctx, s)
}

// writeLBStatus writes s's load-balancer ingress, as a cloud controller
// would, when s is of type LoadBalancer.
func (w *apiStore) writeLBStatus(ctx context.Context, s *service) error {
	if s.kind != corev1.ServiceTypeLoadBalancer || !s.lbIP.IsValid() {
		return nil
	}
	ing := []corev1.LoadBalancerIngress{{IP: s.lbIP.String()}}
	if len(s.obj.Status.LoadBalancer.Ingress) == 1 && s.obj.Status.LoadBalancer.Ingress[0].IP == ing[0].IP {
		return nil
	}
	obj := s.obj.DeepCopy()
	obj.Status.LoadBalancer.Ingress = ing
	out, err := w.client.CoreV1().Services(s.ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	w.writes++
	if err != nil {
		return fmt.Errorf("write the load balancer of %s: %w", s.key(), err)
	}
	s.obj = out
	s.lastWrite = time.Now()
	return nil
}

// deleteService deletes s, then its slices, as the garbage collector would.
func (w *apiStore) deleteService(ctx context.Context, s *service) error {
	err := w.client.CoreV1().Services(s.ns).Delete(ctx, s.name, metav1.DeleteOptions{})
	w.writes++
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %s: %w", s.key(), err)
	}
	s.lastWrite = time.Now()
	for _, sl := range s.slices {
		if err := w.deleteSlice(ctx, s, sl); err != nil {
			return err
		}
	}
	return nil
}

// sliceObject builds the EndpointSlice of sl.
func sliceObject(pods []*netns.Pod, s *service, sl *slice) *discoveryv1.EndpointSlice {
	obj := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sl.name, Namespace: s.ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: s.name,
			discoveryv1.LabelManagedBy:   managedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if sl.obj != nil {
		obj.ResourceVersion = sl.obj.ResourceVersion
	}
	if sl.family == 6 {
		obj.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, p := range s.ports {
		name, proto, port := p.name, p.proto, p.targetPort()
		obj.Ports = append(obj.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	for _, e := range sl.eps {
		pod := pods[e.pod]
		addr := pod.IP
		if sl.family == 6 {
			addr = pod.IP6
		}
		node := otherNode
		if e.local {
			node = nodeName
		}
		ready, serving, terminating := conditions(e.state)
		obj.Endpoints = append(obj.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: s.ns, Name: pod.Name},
		})
	}
	return obj
}

func conditions(st epState) (ready, serving, terminating bool) {
	switch st {
	case epReady:
		return true, true, false
	case epTermServing:
		return false, true, true
	case epTermNotServing:
		return false, false, true
	}
	return false, false, false
}

func (w *apiStore) createSlice(ctx context.Context, s *service, sl *slice) error {
	sl.obj = nil
	out, err := w.client.DiscoveryV1().EndpointSlices(s.ns).Create(ctx, sliceObject(w.pods, s, sl), metav1.CreateOptions{})
	w.writes++
	if err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", s.ns, sl.name, err)
	}
	sl.obj = out
	s.lastWrite = time.Now()
	return nil
}

func (w *apiStore) updateSlice(ctx context.Context, s *service, sl *slice) error {
	out, err := w.client.DiscoveryV1().EndpointSlices(s.ns).Update(ctx, sliceObject(w.pods, s, sl), metav1.UpdateOptions{})
	w.writes++
	if err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", s.ns, sl.name, err)
	}
	sl.obj = out
	s.lastWrite = time.Now()
	return nil
}

func (w *apiStore) deleteSlice(ctx context.Context, s *service, sl *slice) error {
	err := w.client.DiscoveryV1().EndpointSlices(s.ns).Delete(ctx, sl.name, metav1.DeleteOptions{})
	w.writes++
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete EndpointSlice %s/%s: %w", s.ns, sl.name, err)
	}
	s.lastWrite = time.Now()
	return nil
}
