package source

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Compactor makes records of objects, sharing the values records repeat:
// namespaces, node names, zones, port names, protocols and the other
// enumerations. It is safe for concurrent use.
type Compactor struct {
	mu      sync.Mutex
	strings pool[string]
	ports   pool[int32]
}

// NewCompactor returns a Compactor sharing nothing yet.
func NewCompactor() *Compactor { return &Compactor{} }

// maxShared bounds how many distinct values of one kind a Compactor
// shares; past it, it starts over, so that names seen once (nodes long
// gone) do not accumulate. Sharing is an economy, never a meaning: a
// record holding an older copy of a value is as good as one holding the
// newer.
const maxShared = 1 << 16

// pool hands out one copy of each distinct value.
type pool[T comparable] map[T]*T

// get returns the shared pointer to v.
func (p *pool[T]) get(v T) *T {
	if ptr, ok := (*p)[v]; ok {
		return ptr
	}
	if *p == nil || len(*p) >= maxShared {
		*p = pool[T]{}
	}
	ptr := &v
	(*p)[v] = ptr
	return ptr
}

// str returns the shared copy of s.
func (c *Compactor) str(s string) string { return *c.strings.get(s) }

// Transform makes a record of a Service, EndpointSlice or Node and returns
// anything else, records included, as it is. It has the shape of
// client-go's cache.TransformFunc, which may see an object twice.
func (c *Compactor) Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return c.Service(o), nil
	case *discoveryv1.EndpointSlice:
		return c.EndpointSlice(o), nil
	case *corev1.Node:
		return c.Node(o), nil
	}
	return obj, nil
}

// Service returns the record of svc; nil for nil.
func (c *Compactor) Service(svc *corev1.Service) *Service {
	if svc == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	spec := &svc.Spec
	r := &Service{
		Meta:                     c.meta(&svc.ObjectMeta),
		Created:                  svc.CreationTimestamp.Time,
		Labels:                   nonEmptyMap(svc.Labels),
		Annotations:              nonEmptyMap(svc.Annotations),
		Type:                     corev1.ServiceType(c.str(string(spec.Type))),
		ClusterIP:                spec.ClusterIP,
		ClusterIPs:               nonEmpty(spec.ClusterIPs),
		ExternalIPs:              nonEmpty(spec.ExternalIPs),
		LoadBalancerSourceRanges: nonEmpty(spec.LoadBalancerSourceRanges),
		ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicy(c.str(string(spec.ExternalTrafficPolicy))),
		HealthCheckNodePort:      spec.HealthCheckNodePort,
		SessionAffinity:          corev1.ServiceAffinity(c.str(string(spec.SessionAffinity))),
	}
	if _, ok := r.Annotations[lastApplied]; ok {
		r.Annotations = without(r.Annotations, lastApplied)
	}
	if len(r.ClusterIPs) > 0 && r.ClusterIPs[0] == r.ClusterIP {
		r.ClusterIP = r.ClusterIPs[0] // one copy of the text
	}
	if p := spec.InternalTrafficPolicy; p != nil {
		r.InternalTrafficPolicy = corev1.ServiceInternalTrafficPolicy(c.str(string(*p)))
	}
	if cfg := spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
		r.AffinityTimeout = *cfg.ClientIP.TimeoutSeconds
	}
	if len(spec.Ports) > 0 {
		r.Ports = make([]ServicePort, len(spec.Ports))
		for i, p := range spec.Ports {
			r.Ports[i] = ServicePort{Name: c.str(p.Name), Protocol: corev1.Protocol(c.str(string(p.Protocol))), Port: p.Port, NodePort: p.NodePort}
		}
	}
	if in := svc.Status.LoadBalancer.Ingress; len(in) > 0 {
		r.Ingress = make([]Ingress, len(in))
		for i, e := range in {
			r.Ingress[i].IP = e.IP
			if e.IPMode != nil {
				r.Ingress[i].IPMode = corev1.LoadBalancerIPMode(c.str(string(*e.IPMode)))
			}
		}
	}
	return r
}

// EndpointSlice returns the record of s; nil for nil.
func (c *Compactor) EndpointSlice(s *discoveryv1.EndpointSlice) *EndpointSlice {
	if s == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, headless := s.Labels[corev1.IsHeadlessService]
	r := &EndpointSlice{
		Meta:        c.meta(&s.ObjectMeta),
		Service:     s.Labels[discoveryv1.LabelServiceName],
		Headless:    headless,
		TriggerTime: s.Annotations[corev1.EndpointsLastChangeTriggerTime],
		AddressType: discoveryv1.AddressType(c.str(string(s.AddressType))),
	}
	if len(s.Ports) > 0 {
		r.Ports = make([]EndpointPort, len(s.Ports))
		for i, p := range s.Ports {
			out := &r.Ports[i]
			out.Protocol = corev1.ProtocolTCP
			if p.Name != nil {
				out.Name = c.str(*p.Name)
			}
			if p.Protocol != nil {
				out.Protocol = corev1.Protocol(c.str(string(*p.Protocol)))
			}
			if p.Port != nil {
				out.Port = c.ports.get(*p.Port)
			}
		}
	}
	if len(s.Endpoints) > 0 {
		r.Endpoints = make([]Endpoint, len(s.Endpoints))
		for i := range s.Endpoints {
			r.Endpoints[i] = c.endpoint(&s.Endpoints[i])
		}
	}
	return r
}

// endpoint returns the record of one endpoint of a slice.
func (c *Compactor) endpoint(e *discoveryv1.Endpoint) Endpoint {
	cond := e.Conditions
	r := Endpoint{
		NoAddress:   len(e.Addresses) == 0,
		Ready:       cond.Ready == nil || *cond.Ready,
		Serving:     cond.Serving == nil || *cond.Serving,
		Terminating: cond.Terminating != nil && *cond.Terminating,
	}
	if !r.NoAddress {
		r.Address = e.Addresses[0]
	}
	if e.NodeName != nil {
		r.NodeName = c.str(*e.NodeName)
	}
	if e.Zone != nil {
		r.Zone = c.str(*e.Zone)
	}
	if ref := e.TargetRef; ref != nil && (ref.Kind == "Pod" || ref.Kind == "") {
		r.Pod = ref.Name
	}
	if h := e.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
		r.Hints = &Hints{}
		for _, z := range h.ForZones {
			r.Hints.ForZones = append(r.Hints.ForZones, c.str(z.Name))
		}
		for _, n := range h.ForNodes {
			r.Hints.ForNodes = append(r.Hints.ForNodes, c.str(n.Name))
		}
	}
	return r
}

// Node returns the record of node; nil for nil.
func (c *Compactor) Node(node *corev1.Node) *Node {
	if node == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &Node{
		Meta:      c.meta(&node.ObjectMeta),
		Zone:      node.Labels[corev1.LabelTopologyZone],
		PodCIDRs:  nonEmpty(node.Spec.PodCIDRs),
		Addresses: nonEmpty(node.Status.Addresses),
		Deleting:  node.DeletionTimestamp != nil,
	}
	for _, t := range node.Spec.Taints {
		r.ToBeDeleted = r.ToBeDeleted || t.Key == ToBeDeletedTaint
	}
	return r
}

// meta returns the record's metadata of m.
func (c *Compactor) meta(m interface {
	GetNamespace() string
	GetName() string
	GetResourceVersion() string
}) Meta {
	return Meta{Namespace: c.str(m.GetNamespace()), Name: m.GetName(), ResourceVersion: m.GetResourceVersion()}
}

// nonEmpty returns s, or nil when it holds nothing: a record compares
// equal whether its object had an empty list or none.
func nonEmpty[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

// nonEmptyMap is nonEmpty for maps.
func nonEmptyMap[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) == 0 {
		return nil
	}
	return m
}

// without returns a copy of m without key, or nil when nothing else is
// left.
func without(m map[string]string, key string) map[string]string {
	if len(m) <= 1 {
		return nil
	}
	out := make(map[string]string, len(m)-1)
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}
