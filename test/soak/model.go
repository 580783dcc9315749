package soak

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// epState is the condition of one endpoint in its slice.
type epState uint8

// The endpoint states the churn moves endpoints between ("gone" is the
// endpoint's removal from its slice).
const (
	epReady          epState = iota // ready and serving
	epTermServing                   // terminating, still serving
	epTermNotServing                // terminating, no longer serving
	epNotReady                      // not ready, not terminating
	numStates
)

var stateNames = [...]string{"ready", "terminating-serving", "terminating", "not-ready"}

func (s epState) String() string { return stateNames[s] }

// endpoint is one pod in one slice.
type endpoint struct {
	pod   int // index into cluster.pods
	state epState
	local bool // on this node; otherwise on otherNode
}

// slice is one EndpointSlice of a service, of one address family.
type slice struct {
	name   string
	family int // 4 or 6
	eps    []endpoint
	obj    *discoveryv1.EndpointSlice // as last stored
}

// svcPort is one port of a service.
type svcPort struct {
	name  string
	proto corev1.Protocol
	port  int32
	// target is the pods' port; 0 means podPort.
	target int32
}

func (p svcPort) targetPort() int32 {
	if p.target == 0 {
		return podPort
	}
	return p.target
}

// service is the soak's model of one Service and its slices: what it
// wrote, from which what the datapath may do is derived.
type service struct {
	ns, name    string
	kind        corev1.ServiceType
	ports       []svcPort
	dual        bool // PreferDualStack: an IPv6 cluster IP and IPv6 slices too
	itpLocal    bool // internalTrafficPolicy Local
	etpLocal    bool // externalTrafficPolicy Local (NodePort and LoadBalancer only)
	affinity    int32
	externalIPs []netip.Addr
	lbIP        netip.Addr // the load-balancer ingress written to its status
	annotations map[string]string
	// victim is the hostile plugin slot whose annotation it carries, if any.
	victim string
	slices []*slice
	obj    *corev1.Service // as last stored: cluster IPs, node ports, creation time
	// lastWrite is when the soak last wrote the service or one of its slices.
	lastWrite time.Time
	// conflict marks a service created to claim another's destination.
	conflict bool
	held     bool // the held service: never churned
	nextID   int  // numbers its slices
	// forceClusterIP and forceNodePort make the files store give the
	// service another's cluster IP or node port (for its first port): a
	// conflict only a folder of manifests can hold.
	forceClusterIP netip.Addr
	forceNodePort  int32
}

func (s *service) key() string { return s.ns + "/" + s.name }

// created is the API server's creation time of the service.
func (s *service) created() time.Time {
	if s.obj == nil {
		return time.Time{}
	}
	return s.obj.CreationTimestamp.Time
}

// older reports whether s wins a conflict against o: the older object, as
// kube-proxy and the API server resolve them; the name breaks ties.
func (s *service) older(o *service) bool {
	if a, b := s.created(), o.created(); !a.Equal(b) {
		return a.Before(b)
	}
	return s.key() < o.key()
}

// clusterIPs are the stored cluster IPs, IPv4 first.
func (s *service) clusterIPs() []netip.Addr {
	if s.obj == nil {
		return nil
	}
	var out []netip.Addr
	for _, ip := range s.obj.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// nodePort is the stored node port of the port named name, or 0.
func (s *service) nodePort(name string) uint16 {
	if s.obj == nil || s.kind == corev1.ServiceTypeClusterIP {
		return 0
	}
	for _, p := range s.obj.Spec.Ports {
		if p.Name == name {
			return uint16(p.NodePort)
		}
	}
	return 0
}

// destKind is how a probe reaches a service.
type destKind uint8

const (
	viaCluster destKind = iota
	viaNodePort
	viaExternal // an external or load-balancer IP
)

var destKindNames = [...]string{"cluster IP", "node port", "external IP"}

func (k destKind) String() string { return destKindNames[k] }

// dest is one address a probe connects to.
type dest struct {
	kind destKind
	addr netip.AddrPort
}

func (d dest) String() string { return fmt.Sprintf("%s %s", d.kind, d.addr) }

// destinations lists the TCP destinations of s that a client outside the
// node can reach, with nodeIP the node's address of each family.
func (s *service) destinations(nodeIP map[int]netip.Addr) []dest {
	var out []dest
	for _, p := range s.ports {
		if p.proto != corev1.ProtocolTCP {
			continue
		}
		for _, ip := range s.clusterIPs() {
			out = append(out, dest{viaCluster, netip.AddrPortFrom(ip, uint16(p.port))})
		}
		if np := s.nodePort(p.name); np != 0 {
			out = append(out, dest{viaNodePort, netip.AddrPortFrom(nodeIP[4], np)})
			if s.dual {
				out = append(out, dest{viaNodePort, netip.AddrPortFrom(nodeIP[6], np)})
			}
		}
		for _, ip := range s.externalIPs {
			out = append(out, dest{viaExternal, netip.AddrPortFrom(ip, uint16(p.port))})
		}
		if s.lbIP.IsValid() {
			out = append(out, dest{viaExternal, netip.AddrPortFrom(s.lbIP, uint16(p.port))})
		}
	}
	return out
}

// allowed returns the pods a new connection to d may reach from a client
// outside the cluster, as kube-proxy categorizes endpoints: the ready
// endpoints of d's family (only this node's under a Local policy), or,
// when none is ready, the serving terminating ones. Plugins may re-weight
// or drop endpoints but never add one, so the result is a superset of
// what the plan sends d to.
func (s *service) allowed(d dest) map[int]bool {
	family := 4
	if d.addr.Addr().Is6() {
		family = 6
	}
	local := s.itpLocal
	if d.kind != viaCluster {
		local = s.etpLocal
	}
	ready, serving := map[int]bool{}, map[int]bool{}
	for _, sl := range s.slices {
		if sl.family != family {
			continue
		}
		for _, e := range sl.eps {
			if local && !e.local {
				continue
			}
			switch e.state {
			case epReady:
				ready[e.pod] = true
			case epTermServing:
				serving[e.pod] = true
			}
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return serving
}

// pods lists the pods s has endpoints for in family.
func (s *service) pods(family int) []int {
	var out []int
	for _, sl := range s.slices {
		if sl.family != family {
			continue
		}
		for _, e := range sl.eps {
			if !slices.Contains(out, e.pod) {
				out = append(out, e.pod)
			}
		}
	}
	return out
}

// families are the address families s has slices for.
func (s *service) families() []int {
	if s.dual {
		return []int{4, 6}
	}
	return []int{4}
}

// describe is a one-line account of the service as the soak wrote it.
func (s *service) describe(pods []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", s.key(), s.kind)
	for _, p := range s.ports {
		fmt.Fprintf(&b, " %s/%s:%d", p.name, p.proto, p.port)
	}
	if s.dual {
		b.WriteString(" dual-stack")
	}
	if s.itpLocal {
		b.WriteString(" itp=Local")
	}
	if s.etpLocal {
		b.WriteString(" etp=Local")
	}
	if s.affinity > 0 {
		fmt.Fprintf(&b, " affinity=%ds", s.affinity)
	}
	for k, v := range s.annotations {
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	for _, sl := range s.slices {
		fmt.Fprintf(&b, "; slice %s (IPv%d):", sl.name, sl.family)
		for _, e := range sl.eps {
			where := "other"
			if e.local {
				where = "local"
			}
			fmt.Fprintf(&b, " %s=%s/%s", pods[e.pod], e.state, where)
		}
	}
	return b.String()
}
