package planner

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

// defaultAffinitySeconds is Kubernetes' default ClientIP affinity timeout.
const defaultAffinitySeconds = 10800

// serviceShape returns what every port of the service shares: addresses,
// source ranges, traffic policies, health check port and affinity.
func serviceShape(cfg Config, obj string, svc *source.Service) (*plan.Service, []Problem) {
	sh := &plan.Service{}
	var problems []Problem
	sh.ClusterIPs, problems = clusterIPs(obj, svc)
	var p []Problem
	sh.ExternalIPs, p = parseAddrs(obj, "spec.externalIPs", svc.ExternalIPs)
	problems = append(problems, p...)
	if svc.Type == corev1.ServiceTypeLoadBalancer {
		sh.LoadBalancerIPs, p = ingressIPs(obj, svc)
		problems = append(problems, p...)
		sh.SourceRanges, p = sourceRanges(obj, svc)
		problems = append(problems, p...)
	}
	sh.ExternalLocal = externalPolicyApplies(svc) && svc.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	sh.InternalLocal = svc.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if sh.ExternalLocal && svc.Type == corev1.ServiceTypeLoadBalancer {
		sh.HealthCheckNodePort, p = healthCheckPort(cfg, obj, svc)
		problems = append(problems, p...)
	}
	sh.Affinity = affinity(svc)
	// Hook plugins see the Service's labels and annotations: all of them
	// but kubectl's last-applied copy, which the record leaves out.
	sh.Labels = svc.Labels
	sh.Annotations = svc.Annotations
	return sh, problems
}

// externalPolicyApplies reports whether externalTrafficPolicy governs the
// service: a NodePort or LoadBalancer service, or a ClusterIP service with
// external IPs, as kube-proxy decides it (ExternallyAccessible).
func externalPolicyApplies(svc *source.Service) bool {
	return hasNodePorts(svc) || (svc.Type == corev1.ServiceTypeClusterIP && len(svc.ExternalIPs) > 0)
}

func clusterIPs(obj string, svc *source.Service) ([]netip.Addr, []Problem) {
	if len(svc.ClusterIPs) > 0 {
		return parseAddrs(obj, "spec.clusterIPs", svc.ClusterIPs)
	}
	ip, err := netip.ParseAddr(svc.ClusterIP)
	if err != nil {
		return nil, []Problem{{obj, "spec.clusterIP", fmt.Sprintf("%q is not an IP address", svc.ClusterIP)}}
	}
	return []netip.Addr{ip.Unmap()}, nil
}

// parseAddrs parses a list of IP addresses, skipping (and reporting) bad
// ones and duplicates.
func parseAddrs(obj, field string, raw []string) ([]netip.Addr, []Problem) {
	var ips []netip.Addr
	var problems []Problem
	for i, s := range raw {
		ips, problems = addAddr(ips, problems, obj, fmt.Sprintf("%s[%d]", field, i), s)
	}
	return ips, problems
}

// addAddr appends s to ips when it is a new, valid address, or a problem
// naming field to problems.
func addAddr(ips []netip.Addr, problems []Problem, obj, field, s string) ([]netip.Addr, []Problem) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ips, append(problems, Problem{obj, field, fmt.Sprintf("%q is not an IP address", s)})
	}
	if ip = ip.Unmap(); !slices.Contains(ips, ip) {
		ips = append(ips, ip)
	}
	return ips, problems
}

// ingressIPs returns the load balancer's ingress IPs this node must capture:
// those with ipMode VIP (or unset). With ipMode Proxy the balancer sends
// traffic to the node itself, so capturing the IP would be wrong.
func ingressIPs(obj string, svc *source.Service) ([]netip.Addr, []Problem) {
	var ips []netip.Addr
	var problems []Problem
	for i, in := range svc.Ingress {
		if in.IP == "" || in.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		ips, problems = addAddr(ips, problems, obj, fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), in.IP)
	}
	return ips, problems
}

func sourceRanges(obj string, svc *source.Service) ([]netip.Prefix, []Problem) {
	var out []netip.Prefix
	var problems []Problem
	for i, s := range svc.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			problems = append(problems, Problem{obj, fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i),
				fmt.Sprintf("%q is not a CIDR", s)})
			continue
		}
		out = append(out, p.Masked())
	}
	return out, problems
}

func healthCheckPort(cfg Config, obj string, svc *source.Service) (uint16, []Problem) {
	p := svc.HealthCheckNodePort
	if p == 0 {
		return 0, nil
	}
	if why := cfg.NodePorts.check(p); why != "" {
		return 0, []Problem{{obj, "spec.healthCheckNodePort", why}}
	}
	return uint16(p), nil
}

func affinity(svc *source.Service) *plan.Affinity {
	if svc.SessionAffinity != corev1.ServiceAffinityClientIP {
		return nil
	}
	timeout := uint32(defaultAffinitySeconds)
	if svc.AffinityTimeout > 0 {
		timeout = uint32(svc.AffinityTimeout)
	}
	return &plan.Affinity{TimeoutSeconds: timeout}
}
