package source

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Records returns what a source delivers to h: h itself when it takes
// records, or else a RecordHandler handing h objects made from the records
// (Object), which hold what the records keep. Reports and service CIDRs
// are passed on to an h that takes them.
func Records(h Handler) RecordHandler {
	if r, ok := h.(RecordHandler); ok {
		return r
	}
	return objects{h}
}

// objects hands a Handler objects made from records.
type objects struct{ h Handler }

var (
	_ Reporter           = objects{}
	_ ServiceCIDRHandler = objects{}
)

func (o objects) OnServiceRecord(prev, cur *Service) { o.h.OnService(prev.Object(), cur.Object()) }

func (o objects) OnEndpointSliceRecord(prev, cur *EndpointSlice) {
	o.h.OnEndpointSlice(prev.Object(), cur.Object())
}

func (o objects) OnNodeRecord(prev, cur *Node) { o.h.OnNode(prev.Object(), cur.Object()) }

func (o objects) OnSynced() { o.h.OnSynced() }

func (o objects) OnSourceDown(err error) {
	if r, ok := o.h.(Reporter); ok {
		r.OnSourceDown(err)
	}
}

func (o objects) OnSourceUp() {
	if r, ok := o.h.(Reporter); ok {
		r.OnSourceUp()
	}
}

func (o objects) OnServiceCIDRs(cidrs []netip.Prefix) {
	if c, ok := o.h.(ServiceCIDRHandler); ok {
		c.OnServiceCIDRs(cidrs)
	}
}

// objectMeta returns the metadata of an object made from a record.
func (m *Meta) objectMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, ResourceVersion: m.ResourceVersion}
}

// Object returns a Service holding what s keeps; nil for nil. It shares
// s's lists and maps, which nobody modifies.
func (s *Service) Object() *corev1.Service {
	if s == nil {
		return nil
	}
	o := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: s.objectMeta(),
		Spec: corev1.ServiceSpec{
			Type:                     s.Type,
			ClusterIP:                s.ClusterIP,
			ClusterIPs:               s.ClusterIPs,
			ExternalIPs:              s.ExternalIPs,
			LoadBalancerSourceRanges: s.LoadBalancerSourceRanges,
			ExternalTrafficPolicy:    s.ExternalTrafficPolicy,
			HealthCheckNodePort:      s.HealthCheckNodePort,
			SessionAffinity:          s.SessionAffinity,
		},
	}
	o.CreationTimestamp = metav1.NewTime(s.Created)
	o.Labels, o.Annotations = s.Labels, s.Annotations
	if s.InternalTrafficPolicy != "" {
		p := s.InternalTrafficPolicy
		o.Spec.InternalTrafficPolicy = &p
	}
	if s.AffinityTimeout != 0 {
		t := s.AffinityTimeout
		o.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	for _, p := range s.Ports {
		o.Spec.Ports = append(o.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort})
	}
	for _, in := range s.Ingress {
		e := corev1.LoadBalancerIngress{IP: in.IP}
		if in.IPMode != "" {
			mode := in.IPMode
			e.IPMode = &mode
		}
		o.Status.LoadBalancer.Ingress = append(o.Status.LoadBalancer.Ingress, e)
	}
	return o
}

// Object returns an EndpointSlice holding what s keeps; nil for nil.
func (s *EndpointSlice) Object() *discoveryv1.EndpointSlice {
	if s == nil {
		return nil
	}
	o := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  s.objectMeta(),
		AddressType: s.AddressType,
	}
	if s.Service != "" || s.Headless {
		o.Labels = map[string]string{}
		if s.Service != "" {
			o.Labels[discoveryv1.LabelServiceName] = s.Service
		}
		if s.Headless {
			o.Labels[corev1.IsHeadlessService] = ""
		}
	}
	if s.TriggerTime != "" {
		o.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: s.TriggerTime}
	}
	for _, p := range s.Ports {
		name, proto := p.Name, p.Protocol
		o.Ports = append(o.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: p.Port})
	}
	for _, e := range s.Endpoints {
		o.Endpoints = append(o.Endpoints, e.object())
	}
	return o
}

// object returns the endpoint of an EndpointSlice holding what e keeps.
func (e Endpoint) object() discoveryv1.Endpoint {
	ready, serving, terminating := e.Ready, e.Serving, e.Terminating
	o := discoveryv1.Endpoint{
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
	}
	if !e.NoAddress {
		o.Addresses = []string{e.Address}
	}
	if e.NodeName != "" {
		name := e.NodeName
		o.NodeName = &name
	}
	if e.Zone != "" {
		zone := e.Zone
		o.Zone = &zone
	}
	if e.Pod != "" {
		o.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: e.Pod}
	}
	if h := e.Hints; h != nil {
		o.Hints = &discoveryv1.EndpointHints{}
		for _, z := range h.ForZones {
			o.Hints.ForZones = append(o.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
		for _, n := range h.ForNodes {
			o.Hints.ForNodes = append(o.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
	return o
}

// Object returns a Node holding what n keeps; nil for nil.
func (n *Node) Object() *corev1.Node {
	if n == nil {
		return nil
	}
	o := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: n.objectMeta(),
		Spec:       corev1.NodeSpec{PodCIDRs: n.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Addresses},
	}
	if n.Zone != "" {
		o.Labels = map[string]string{corev1.LabelTopologyZone: n.Zone}
	}
	if n.Deleting {
		o.DeletionTimestamp = &metav1.Time{}
	}
	if n.ToBeDeleted {
		o.Spec.Taints = []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}
	}
	return o
}

// GetLabels returns the Service's labels.
func (s *Service) GetLabels() map[string]string { return s.Labels }

// GetAnnotations returns the Service's annotations.
func (s *Service) GetAnnotations() map[string]string { return s.Annotations }

// GetCreationTimestamp returns the Service's creation time.
func (s *Service) GetCreationTimestamp() metav1.Time { return metav1.NewTime(s.Created) }
