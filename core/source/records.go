package source

import (
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Weir reads a small part of the objects it watches, and keeps every one of
// them for as long as it exists. Sources therefore keep and deliver
// records: what Weir reads of a Service, EndpointSlice or Node, in plain
// fields, with the values many objects repeat (node names, zones,
// namespaces, port names, protocols) shared between them. A Compactor
// makes records from objects; a record's Object method makes an object
// holding what the record keeps, for handlers that take objects.
//
// Lists keep their positions (ports, load-balancer ingress entries,
// endpoints): a problem the planner reports names the same index as the
// object as written. Fields keep the object's raw text where the planner
// reports bad input (addresses, ranges), so a record reports exactly what
// its object would.
//
// Records, like the objects a source delivers, are never modified once
// delivered: a change is a new record.

// Service is what Weir reads of a Service: the fields the planner plans
// from, the labels and annotations hook plugins read (all annotations but
// kubectl's last-applied copy of the object) and the creation time, which
// decides between two Services claiming one destination.
type Service struct {
	Meta
	Created     time.Time
	Labels      map[string]string
	Annotations map[string]string
	Type        corev1.ServiceType
	// ClusterIP and ClusterIPs are spec.clusterIP and spec.clusterIPs.
	ClusterIP                string
	ClusterIPs               []string
	Ports                    []ServicePort
	ExternalIPs              []string
	LoadBalancerSourceRanges []string
	ExternalTrafficPolicy    corev1.ServiceExternalTrafficPolicy
	// InternalTrafficPolicy is "" when the Service sets none.
	InternalTrafficPolicy corev1.ServiceInternalTrafficPolicy
	HealthCheckNodePort   int32
	SessionAffinity       corev1.ServiceAffinity
	// AffinityTimeout is spec.sessionAffinityConfig.clientIP.timeoutSeconds;
	// 0 when unset.
	AffinityTimeout int32
	// Ingress are status.loadBalancer.ingress.
	Ingress []Ingress
}

// ServicePort is one of spec.ports.
type ServicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	NodePort int32
}

// Ingress is one of a load balancer's ingress entries; IPMode is "" when
// unset (an entry with a hostname only has no IP).
type Ingress struct {
	IP     string
	IPMode corev1.LoadBalancerIPMode
}

// EndpointSlice is what Weir reads of an EndpointSlice.
type EndpointSlice struct {
	Meta
	// Service is the kubernetes.io/service-name label: the Service the
	// slice belongs to; "" when the label is missing.
	Service string
	// Headless is set when the slice carries the
	// service.kubernetes.io/headless label.
	Headless bool
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, as written.
	TriggerTime string
	AddressType discoveryv1.AddressType
	Ports       []EndpointPort
	Endpoints   []Endpoint
}

// EndpointPort is one of an EndpointSlice's ports. Protocol is TCP when the
// port sets none (the API's default); Port is nil when unset.
type EndpointPort struct {
	Name     string
	Protocol corev1.Protocol
	Port     *int32
}

// Endpoint is one endpoint of an EndpointSlice, with the API's defaults for
// missing conditions applied (ready and serving unless said otherwise, not
// terminating).
type Endpoint struct {
	// Address is the first of the endpoint's addresses, the one kube-proxy
	// uses; NoAddress is set when it lists none.
	Address string
	// NodeName and Zone are "" when unset.
	NodeName string
	Zone     string
	// Pod is the name of the endpoint's targetRef when that is a Pod (or
	// of no kind); "" otherwise.
	Pod string
	// Hints are the topology hints; nil when there are none.
	Hints       *Hints
	NoAddress   bool
	Ready       bool
	Serving     bool
	Terminating bool
}

// Hints are an endpoint's topology hints: the zones and nodes it should
// serve.
type Hints struct {
	ForZones []string
	ForNodes []string
}

// Node is what Weir reads of this node's Node.
type Node struct {
	Meta
	// Zone is the topology.kubernetes.io/zone label.
	Zone      string
	PodCIDRs  []string
	Addresses []corev1.NodeAddress
	// Deleting is set once the Node has a deletion timestamp.
	Deleting bool
	// ToBeDeleted is set while the Node carries the cluster autoscaler's
	// ToBeDeletedByClusterAutoscaler taint.
	ToBeDeleted bool
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a Node it is
// about to remove.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// lastApplied is kubectl's copy of the whole object (what `kubectl apply`
// compares with): as large as the object, and read by no part of Weir.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// Key returns the record's namespace/name.
func (m *Meta) Key() string { return m.Namespace + "/" + m.Name }

// Same reports whether two Services are the same but for their resource
// versions.
func (s *Service) Same(o *Service) bool {
	a, b := *s, *o
	a.ResourceVersion, b.ResourceVersion = "", ""
	// Equal times may differ in their location.
	same := a.Created.Equal(b.Created)
	a.Created, b.Created = time.Time{}, time.Time{}
	return same && reflect.DeepEqual(a, b)
}

// Same reports whether two EndpointSlices are the same but for their
// resource versions.
func (s *EndpointSlice) Same(o *EndpointSlice) bool {
	a, b := *s, *o
	a.ResourceVersion, b.ResourceVersion = "", ""
	return reflect.DeepEqual(a, b)
}

// Same reports whether two Nodes are the same but for their resource
// versions.
func (n *Node) Same(o *Node) bool {
	a, b := *n, *o
	a.ResourceVersion, b.ResourceVersion = "", ""
	return reflect.DeepEqual(a, b)
}
