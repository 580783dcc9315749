package plan

import (
	"fmt"
	"strings"
)

// String renders the whole plan as deterministic text, services in key order.
func (p *Plan) String() string {
	var b strings.Builder
	b.WriteString(p.Node.String())
	if len(p.ServiceCIDRs) > 0 {
		b.WriteString("serviceCIDRs")
		for _, c := range p.ServiceCIDRs {
			fmt.Fprintf(&b, " %s", c)
		}
		b.WriteByte('\n')
	}
	for _, k := range p.Keys() {
		b.WriteString(p.Services[k].String())
	}
	return b.String()
}

// String renders the node as one line.
func (n Node) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s", orDash(n.Name))
	if n.Zone != "" {
		fmt.Fprintf(&b, " zone=%s", n.Zone)
	}
	for _, a := range n.Addresses {
		fmt.Fprintf(&b, " address=%s", a)
	}
	for _, c := range n.PodCIDRs {
		fmt.Fprintf(&b, " podCIDR=%s", c)
	}
	b.WriteByte('\n')
	return b.String()
}

// String renders the service and its endpoints as indented lines.
func (s *Service) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "service %s\n", s.Key)
	for _, ip := range s.ClusterIPs {
		fmt.Fprintf(&b, "  clusterIP %s port %d\n", ip, s.Port)
	}
	if s.NodePort != 0 {
		fmt.Fprintf(&b, "  nodePort %d\n", s.NodePort)
	}
	for _, ip := range s.ExternalIPs {
		fmt.Fprintf(&b, "  externalIP %s\n", ip)
	}
	for _, ip := range s.LoadBalancerIPs {
		fmt.Fprintf(&b, "  loadBalancerIP %s\n", ip)
	}
	for _, r := range s.SourceRanges {
		fmt.Fprintf(&b, "  sourceRange %s\n", r)
	}
	b.WriteString(s.policyLine())
	if len(s.Endpoints) == 0 {
		b.WriteString("  no endpoints: reject\n")
	}
	for _, e := range s.Endpoints {
		b.WriteString("  ")
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// policyLine renders traffic policies, health check and affinity, or
// nothing when all are defaults.
func (s *Service) policyLine() string {
	var parts []string
	if s.ExternalLocal {
		parts = append(parts, "externalTrafficPolicy=Local")
	}
	if s.InternalLocal {
		parts = append(parts, "internalTrafficPolicy=Local")
	}
	if s.HealthCheckNodePort != 0 {
		parts = append(parts, fmt.Sprintf("healthCheckNodePort=%d", s.HealthCheckNodePort))
	}
	if s.Affinity != nil {
		parts = append(parts, fmt.Sprintf("affinity=ClientIP/%ds", s.Affinity.TimeoutSeconds))
	}
	if s.Scheduler != SchedulerDefault {
		parts = append(parts, "scheduler="+string(s.Scheduler))
	}
	if len(parts) == 0 {
		return ""
	}
	return "  " + strings.Join(parts, " ") + "\n"
}

// String renders the endpoint as one line.
func (e Endpoint) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "endpoint %s weight=%d", e.AddrPort(), e.Weight)
	if e.NodeName != "" {
		fmt.Fprintf(&b, " node=%s", e.NodeName)
	}
	if e.Zone != "" {
		fmt.Fprintf(&b, " zone=%s", e.Zone)
	}
	if e.Pod != "" {
		fmt.Fprintf(&b, " pod=%s", e.Pod)
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}, {e.Local, "local"},
		{!e.ForCluster, "not-for-cluster"}, {e.ForLocal, "for-local"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
