// Package planner turns Kubernetes objects, as the sources' records hold
// them, into Weir's rule plan. It is pure: no kernel, no clock, no I/O; the
// same records always give the same plan.
package planner

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
	"github.com/weirproxy/weir/sdk/plan"
)

// LabelServiceProxyName is the label kube-proxy honours on Services: a
// service naming another proxy is not ours to program.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// Config is what the planner needs to know about this node.
type Config struct {
	NodeName string
	// Zone is the node's topology.kubernetes.io/zone label, for topology hints.
	Zone string
	// NodePorts is the range node ports and health check node ports must
	// lie in (the API server's service-node-port-range); the zero value
	// allows every port.
	NodePorts PortRange
}

// PortRange is an inclusive range of ports; the zero value holds every
// port.
type PortRange struct{ First, Last uint16 }

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port uint16) bool {
	return r == PortRange{} || (port >= r.First && port <= r.Last)
}

// check returns why port, set in field, is not acceptable as a node port,
// or "".
func (r PortRange) check(port int32) string {
	switch {
	case port < 1 || port > 65535:
		return fmt.Sprintf("%d is out of range 1-65535", port)
	case !r.Contains(uint16(port)):
		return fmt.Sprintf("%d is outside nodePortRange %d-%d", port, r.First, r.Last)
	}
	return ""
}

// Problem is a piece of bad input the planner skipped: which object, which
// field, and why. Everything else in the object still counts.
type Problem struct {
	Object string // e.g. "Service default/web"
	Field  string // e.g. "spec.clusterIPs[0]"
	Reason string
}

func (p Problem) String() string { return fmt.Sprintf("%s: %s: %s", p.Object, p.Field, p.Reason) }

// Service plans every port of one service. It returns no services for
// objects Weir does not proxy (headless, ExternalName, another proxy's) and
// reports skipped bad input as problems.
func Service(cfg Config, st tracker.ServiceState) ([]*plan.Service, []Problem) {
	svc := st.Service
	if svc == nil || !proxied(svc) {
		return nil, nil
	}
	obj := "Service " + svc.Namespace + "/" + svc.Name
	sh, problems := serviceShape(cfg, obj, svc)
	if len(sh.ClusterIPs) == 0 {
		return nil, problems
	}
	var out []*plan.Service
	// Every port reads the same slices: report a bad endpoint once, not once per port.
	seen := map[Problem]bool{}
	names := map[string]bool{}
	for i, port := range svc.Ports {
		if names[port.Name] {
			problems = append(problems, Problem{obj, fmt.Sprintf("spec.ports[%d].name", i),
				fmt.Sprintf("port name %q is already used by another port", port.Name)})
			continue
		}
		names[port.Name] = true
		ps, p := servicePort(cfg, obj, svc, i, port, sh, st.Slices)
		for _, pr := range p {
			if !seen[pr] {
				seen[pr] = true
				problems = append(problems, pr)
			}
		}
		if ps != nil {
			out = append(out, ps)
		}
	}
	return out, problems
}

// proxied reports whether the service gets rules from Weir.
func proxied(svc *source.Service) bool {
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return false
	}
	if svc.Type == corev1.ServiceTypeExternalName {
		return false
	}
	return svc.ClusterIP != corev1.ClusterIPNone && svc.ClusterIP != ""
}

func servicePort(cfg Config, obj string, svc *source.Service, i int, port source.ServicePort, sh *plan.Service,
	slices []*source.EndpointSlice) (*plan.Service, []Problem) {
	field := fmt.Sprintf("spec.ports[%d]", i)
	proto := plan.Protocol(port.Protocol)
	if proto == "" {
		proto = plan.TCP
	}
	if proto != plan.TCP && proto != plan.UDP && proto != plan.SCTP {
		return nil, []Problem{{obj, field + ".protocol", fmt.Sprintf("%q is not TCP, UDP or SCTP", port.Protocol)}}
	}
	if port.Port < 1 || port.Port > 65535 {
		return nil, []Problem{{obj, field + ".port", fmt.Sprintf("%d is out of range 1-65535", port.Port)}}
	}
	ps := sh.Clone()
	ps.Key = plan.Key{Namespace: svc.Namespace, Name: svc.Name, Port: port.Name, Protocol: proto}
	ps.Port = uint16(port.Port)
	var problems []Problem
	if hasNodePorts(svc) && port.NodePort != 0 {
		if why := cfg.NodePorts.check(port.NodePort); why != "" {
			problems = append(problems, Problem{obj, field + ".nodePort", why})
		} else {
			ps.NodePort = uint16(port.NodePort)
		}
	}
	eps, p := endpoints(cfg, ps, slices)
	ps.Endpoints = eps
	return ps, append(problems, p...)
}

// primaryIPs picks the node's primary addresses as kube-proxy does
// (GetNodeHostIPs): the first InternalIP, or without one the first
// ExternalIP, then the first address of the other family in the same
// order. These are what nodePortAddresses primary serves node ports on.
func primaryIPs(addrs []corev1.NodeAddress) []netip.Addr {
	var out []netip.Addr
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a.Address)
			if a.Type != typ || err != nil {
				continue
			}
			if ip = ip.Unmap(); len(out) == 0 || (len(out) == 1 && ip.Is4() != out[0].Is4()) {
				out = append(out, ip)
			}
		}
	}
	return out
}

// ServiceCIDRs returns the ranges of both lists, masked, sorted and each
// once: the configured ones and those of the ServiceCIDR objects.
func ServiceCIDRs(configured, objects []netip.Prefix) []netip.Prefix {
	if len(configured)+len(objects) == 0 {
		return nil
	}
	out := make([]netip.Prefix, 0, len(configured)+len(objects))
	for _, c := range slices.Concat(configured, objects) {
		out = append(out, c.Masked())
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

func hasNodePorts(svc *source.Service) bool {
	return svc.Type == corev1.ServiceTypeNodePort || svc.Type == corev1.ServiceTypeLoadBalancer
}

// Node converts this node's record (which may be nil) into the plan's node.
func Node(name string, node *source.Node) plan.Node {
	n := plan.Node{Name: name}
	if node == nil {
		return n
	}
	n.Zone = node.Zone
	n.Addresses = primaryIPs(node.Addresses)
	for _, c := range node.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			n.PodCIDRs = append(n.PodCIDRs, p)
		}
	}
	return n
}
