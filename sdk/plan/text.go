package plan

import (
	"fmt"
	"strings"
)

// String renders the whole plan as deterministic text, services in key order.
func (p *Plan) String() string {
	var b strings.Builder
	b.WriteString(p.Node.String())
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
	for _, f := range []struct {
		on   bool
		name string
	}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}, {e.Local, "local"}} {
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
