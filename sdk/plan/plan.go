// Package plan holds the rule plan that flows from Weir's planner through its
// hook plugins to its backends: plain values with no Kubernetes types.
//
// A Plan describes every service port this node proxies. Backends turn it into
// kernel state; hook plugins may re-weight, reorder or drop endpoints and
// change affinity, but never invent addresses.
package plan

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Protocol is a service port's transport protocol.
type Protocol string

// The protocols a service port may use.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Key names one service port: namespace, service name, port name and protocol.
type Key struct {
	Namespace string
	Name      string
	Port      string
	Protocol  Protocol
}

// String formats the key as namespace/name:port/protocol (the port name may be empty).
func (k Key) String() string {
	return k.Namespace + "/" + k.Name + ":" + k.Port + "/" + string(k.Protocol)
}

// Compare orders keys by namespace, name, port name and protocol.
func (k Key) Compare(o Key) int {
	if c := strings.Compare(k.Namespace, o.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(k.Name, o.Name); c != 0 {
		return c
	}
	if c := strings.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	return strings.Compare(string(k.Protocol), string(o.Protocol))
}

// Plan is the complete set of service ports this node proxies.
type Plan struct {
	Node     Node
	Services map[Key]*Service
	// ServiceCIDRs are the ranges cluster IPs are allocated from (the
	// cluster's ServiceCIDR objects and the serviceCIDRs setting), sorted:
	// traffic to an address in them that no service has is dropped, like
	// kube-proxy's nftables mode does.
	ServiceCIDRs []netip.Prefix
}

// Node describes the node Weir runs on.
type Node struct {
	Name string
	Zone string
	// Addresses are the node's primary IPs, at most one per family, as
	// kube-proxy picks them from the Node's InternalIPs and ExternalIPs.
	Addresses []netip.Addr
	PodCIDRs  []netip.Prefix
}

// Service is one service port as this node must proxy it.
type Service struct {
	Key        Key
	ClusterIPs []netip.Addr
	Port       uint16
	// NodePort is 0 when the service has none.
	NodePort uint16
	// ExternalIPs are the spec.externalIPs, reached on Port.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the load balancer's ingress IPs that this node
	// captures (ingress entries with ipMode Proxy are left to the balancer).
	LoadBalancerIPs []netip.Addr
	// SourceRanges limits who may reach LoadBalancerIPs; empty allows all.
	SourceRanges []netip.Prefix
	// ExternalLocal is externalTrafficPolicy: Local: traffic to node ports,
	// external and load-balancer IPs goes only to this node's endpoints and
	// keeps its source address.
	ExternalLocal bool
	// InternalLocal is internalTrafficPolicy: Local: cluster-IP traffic goes
	// only to this node's endpoints.
	InternalLocal bool
	// HealthCheckNodePort serves load-balancer health checks when
	// ExternalLocal is set; 0 when none.
	HealthCheckNodePort uint16
	// Affinity, when set, sends a client's connections to the same endpoint.
	Affinity *Affinity
	// Scheduler is a hint to backends that can choose how to balance
	// (IPVS); empty leaves the backend's default.
	Scheduler Scheduler
	// Labels and Annotations are the Service object's, for hook plugins to
	// match and read. They are shared between clones and never modified in
	// place.
	Labels      map[string]string
	Annotations map[string]string
	// Endpoints are the backends the port balances over, in a stable order.
	Endpoints []Endpoint
}

// Scheduler names a balancing algorithm, as IPVS spells it.
type Scheduler string

// The schedulers a plan may ask for.
const (
	SchedulerDefault                 Scheduler = ""
	SchedulerRoundRobin              Scheduler = "rr"
	SchedulerWeightedRoundRobin      Scheduler = "wrr"
	SchedulerLeastConnection         Scheduler = "lc"
	SchedulerWeightedLeastConnection Scheduler = "wlc"
	SchedulerSourceHash              Scheduler = "sh"
	SchedulerMaglevHash              Scheduler = "mh"
)

// Schedulers lists every scheduler in ABI order: a scheduler's index is
// its code in the plugin ABI.
var Schedulers = []Scheduler{
	SchedulerDefault, SchedulerRoundRobin, SchedulerWeightedRoundRobin, SchedulerLeastConnection,
	SchedulerWeightedLeastConnection, SchedulerSourceHash, SchedulerMaglevHash,
}

// MaxAffinitySeconds is the longest ClientIP affinity timeout Kubernetes allows.
const MaxAffinitySeconds = 86400

// Affinity is ClientIP session affinity.
type Affinity struct {
	// TimeoutSeconds is how long a client stays with its endpoint after its
	// last new connection.
	TimeoutSeconds uint32
}

// Endpoint is one backend of a service port.
//
// A plan holds one per endpoint of every service port, so the fields are
// laid out to leave no padding (88 bytes on 64-bit platforms).
type Endpoint struct {
	Address  netip.Addr
	NodeName string
	Zone     string
	// Pod names the endpoint's pod (its targetRef), or is empty.
	Pod string
	// Weight is the endpoint's share of new connections; 1 by default, 0 means drained.
	Weight  uint32
	Port    uint16
	Ready   bool
	Serving bool
	// Terminating marks an endpoint whose pod is shutting down.
	Terminating bool
	// Local is true when the endpoint runs on this node.
	Local bool
	// ForCluster is true when the endpoint serves traffic under the Cluster
	// traffic policy; ForLocal when it serves traffic under the Local policy.
	// Both are decided by the planner (readiness, terminating fallback,
	// topology), separately for the two policies.
	ForCluster bool
	ForLocal   bool
}

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Address, e.Port) }

// Clone returns a deep copy of the plan.
func (p *Plan) Clone() *Plan {
	if p == nil {
		return nil
	}
	c := &Plan{Node: p.Node.Clone(), Services: make(map[Key]*Service, len(p.Services)), ServiceCIDRs: slices.Clone(p.ServiceCIDRs)}
	for k, s := range p.Services {
		c.Services[k] = s.Clone()
	}
	return c
}

// Clone returns a deep copy of the node.
func (n Node) Clone() Node {
	n.Addresses = slices.Clone(n.Addresses)
	n.PodCIDRs = slices.Clone(n.PodCIDRs)
	return n
}

// Clone returns a deep copy of the service.
func (s *Service) Clone() *Service {
	if s == nil {
		return nil
	}
	c := *s
	c.ClusterIPs = slices.Clone(s.ClusterIPs)
	c.ExternalIPs = slices.Clone(s.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	c.SourceRanges = slices.Clone(s.SourceRanges)
	if s.Affinity != nil {
		a := *s.Affinity
		c.Affinity = &a
	}
	c.Endpoints = slices.Clone(s.Endpoints)
	return &c
}

// Keys returns the plan's service keys in sorted order.
func (p *Plan) Keys() []Key {
	keys := make([]Key, 0, len(p.Services))
	for k := range p.Services {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, Key.Compare)
	return keys
}

// Equal reports whether two services are the same: same rules and same
// input to hook plugins.
func (s *Service) Equal(o *Service) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Key == o.Key && s.Port == o.Port && s.NodePort == o.NodePort && s.Scheduler == o.Scheduler &&
		maps.Equal(s.Labels, o.Labels) && maps.Equal(s.Annotations, o.Annotations) &&
		s.ExternalLocal == o.ExternalLocal && s.InternalLocal == o.InternalLocal &&
		s.HealthCheckNodePort == o.HealthCheckNodePort && equalAffinity(s.Affinity, o.Affinity) &&
		slices.Equal(s.ClusterIPs, o.ClusterIPs) && slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) && slices.Equal(s.SourceRanges, o.SourceRanges) &&
		slices.Equal(s.Endpoints, o.Endpoints)
}

// SameRules reports whether two services would produce the same rules: they
// may differ only in labels, annotations and endpoints' pod names.
func (s *Service) SameRules(o *Service) bool {
	if s == nil || o == nil {
		return s == o
	}
	a, b := *s, *o
	a.Labels, a.Annotations, a.Endpoints = nil, nil, nil
	b.Labels, b.Annotations, b.Endpoints = nil, nil, nil
	return a.Equal(&b) && slices.EqualFunc(s.Endpoints, o.Endpoints, func(x, y Endpoint) bool {
		x.Pod, y.Pod = "", ""
		return x == y
	})
}

func equalAffinity(a, b *Affinity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
