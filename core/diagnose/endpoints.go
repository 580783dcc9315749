package diagnose

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/sdk/plan"
)

// endpointCounts counts a port's endpoints by condition.
type endpointCounts struct {
	total, ready, servingTerminating, terminating, notReady int
	local, forCluster                                       int
	zones, nodes                                            map[string]int
	// hints counts the ready endpoints with zone or node hints, and
	// hintedHere those whose hints name this node or its zone.
	hints, hintedHere int
}

func countEndpoints(eps []plan.Endpoint) endpointCounts {
	c := endpointCounts{total: len(eps), zones: map[string]int{}}
	for _, e := range eps {
		switch {
		case e.Ready:
			c.ready++
		case e.Serving && e.Terminating:
			c.servingTerminating++
		case e.Terminating:
			c.terminating++
		default:
			c.notReady++
		}
		if e.Local {
			c.local++
		}
		if e.ForCluster && e.Weight > 0 {
			c.forCluster++
		}
		if e.Zone != "" {
			c.zones[e.Zone]++
		}
	}
	return c
}

// sliceCounts counts the endpoints the slices list for the Service port
// named port, by their conditions as kube-proxy reads them (ready unset
// is ready, serving unset follows ready, terminating unset is false).
func sliceCounts(slices []*discoveryv1.EndpointSlice, port, node, zone string) endpointCounts {
	c := endpointCounts{zones: map[string]int{}, nodes: map[string]int{}}
	for _, s := range slices {
		if !sliceHasPort(s, port) {
			continue
		}
		for _, e := range s.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := ready
			if e.Conditions.Serving != nil {
				serving = *e.Conditions.Serving
			}
			terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			c.total++
			switch {
			case ready && !terminating:
				c.ready++
			case serving && terminating:
				c.servingTerminating++
			case terminating:
				c.terminating++
			default:
				c.notReady++
			}
			if e.NodeName != nil && *e.NodeName != "" {
				c.nodes[*e.NodeName]++
				if *e.NodeName == node {
					c.local++
				}
			}
			if ready && !terminating {
				c.countHints(e.Hints, node, zone)
			}
			if e.Zone != nil && *e.Zone != "" {
				c.zones[*e.Zone]++
			}
		}
	}
	return c
}

// countHints counts a ready endpoint's topology hints.
func (c *endpointCounts) countHints(h *discoveryv1.EndpointHints, node, zone string) {
	if h == nil || len(h.ForZones) == 0 && len(h.ForNodes) == 0 {
		return
	}
	c.hints++
	for _, z := range h.ForZones {
		if z.Name == zone && zone != "" {
			c.hintedHere++
			return
		}
	}
	for _, n := range h.ForNodes {
		if n.Name == node {
			c.hintedHere++
			return
		}
	}
}

// topologyIgnored says why the slices' hints are not followed, as the
// planner decides like kube-proxy: every ready endpoint must carry hints
// and one must name this node or its zone; "" when there are none.
func (c endpointCounts) topologyIgnored(zone string) string {
	switch {
	case c.hints == 0:
		return ""
	case c.hints < c.ready:
		return fmt.Sprintf("only %d of the %d ready endpoints carry hints", c.hints, c.ready)
	case zone == "":
		return "this node has no zone (its topology.kubernetes.io/zone label)"
	case c.hintedHere == 0:
		return fmt.Sprintf("no hint names this node or its zone %s", zone)
	}
	return "the planner found them unusable"
}

// sliceHasPort says whether the slice lists the Service port named port.
func sliceHasPort(s *discoveryv1.EndpointSlice, port string) bool {
	for _, p := range s.Ports {
		if p.Port != nil && (p.Name == nil && port == "" || p.Name != nil && *p.Name == port) {
			return true
		}
	}
	return false
}

// endpointFindings reports a port's endpoints: c counts them as the
// slices list them, s is the planner's service, before the plugins.
func endpointFindings(subject, node, zone string, c endpointCounts, s *plan.Service) []Finding {
	c.forCluster = countEndpoints(s.Endpoints).forCluster
	f := func(code string, sev Severity, format string, args ...any) Finding {
		return Finding{Code: code, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...)}
	}
	if c.total == 0 {
		return []Finding{f("endpoints.none", Broken, "no endpoints: connections to this port are rejected on this node")}
	}
	out := []Finding{f("endpoints.counts", Info, "%s", c.describe(node))}
	switch {
	case c.forCluster == 0 && c.ready == 0 && c.servingTerminating == 0:
		out = append(out, f("endpoints.none-serving", Broken,
			"none of the %d endpoints is ready or serving: connections to this port are rejected on this node", c.total))
	case c.forCluster == 0:
		out = append(out, f("endpoints.none-used", Broken,
			"the planner uses none of the %d endpoints for cluster traffic on this node: connections to this port are rejected", c.total))
	case c.ready == 0:
		out = append(out, f("endpoints.terminating-fallback", Warning,
			"no endpoint is ready: traffic goes to the %d terminating endpoints that still serve, as kube-proxy does, until they are gone",
			c.servingTerminating))
	case c.forCluster > 0 && c.forCluster < c.ready:
		out = append(out, f("endpoints.topology", Info,
			"topology in force: cluster traffic from this node goes to %d of the %d ready endpoints (those hinted for this node or its zone)",
			c.forCluster, c.ready))
	case c.topologyIgnored(zone) != "":
		out = append(out, f("endpoints.topology-ignored", Info,
			"the EndpointSlices carry topology hints, but they are not followed: %s; traffic goes to every ready endpoint", c.topologyIgnored(zone)))
	}
	return out
}

// describe says how many endpoints there are in each condition, on this
// node and per zone.
func (c endpointCounts) describe(node string) string {
	parts := []string{fmt.Sprintf("%d ready", c.ready)}
	if c.servingTerminating > 0 {
		parts = append(parts, fmt.Sprintf("%d terminating and still serving", c.servingTerminating))
	}
	if c.terminating > 0 {
		parts = append(parts, fmt.Sprintf("%d terminating", c.terminating))
	}
	if c.notReady > 0 {
		parts = append(parts, fmt.Sprintf("%d not ready", c.notReady))
	}
	s := fmt.Sprintf("%d %s (%s), %d on this node (%s)", c.total, plural(c.total, "endpoint", "endpoints"),
		strings.Join(parts, ", "), c.local, node)
	if len(c.nodes) > 0 {
		s += "; by node: " + countList(c.nodes, 5)
	}
	if len(c.zones) > 0 {
		s += "; by zone: " + countList(c.zones, 10)
	}
	return s
}

// countList formats counts by name, largest first, at most max of them.
func countList(counts map[string]int, limit int) string {
	names := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
	var parts []string
	for i, n := range names {
		if i == limit {
			parts = append(parts, fmt.Sprintf("and %d more", len(names)-limit))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", n, counts[n]))
	}
	return strings.Join(parts, ", ")
}

// policyFindings reports what the traffic policies leave for this node.
func policyFindings(subject string, s *plan.Service) []Finding {
	local := 0
	for _, e := range s.Endpoints {
		if e.Local && e.ForLocal && e.Weight > 0 {
			local++
		}
	}
	f := func(code string, sev Severity, format string, args ...any) Finding {
		return Finding{Code: code, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...)}
	}
	var out []Finding
	if s.InternalLocal && local == 0 && len(s.Endpoints) > 0 {
		out = append(out, f("policy.internal-local-no-endpoints", Broken,
			"internalTrafficPolicy Local and no endpoint serves on this node: connections from this node to the cluster IP are dropped"))
	}
	external := s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
	switch {
	case !s.ExternalLocal || !external:
	case local == 0:
		hc := ""
		if s.HealthCheckNodePort != 0 {
			hc = fmt.Sprintf("; the health check on node port %d answers 503, so load balancers send elsewhere", s.HealthCheckNodePort)
		}
		out = append(out, f("policy.external-local-no-endpoints", Broken,
			"externalTrafficPolicy Local and no endpoint on this node: node port and load-balancer traffic to this node is dropped%s", hc))
	default:
		out = append(out, f("policy.external-local", Info,
			"externalTrafficPolicy Local: external traffic to this node goes to its %d local %s and keeps the client's address",
			local, plural(local, "endpoint", "endpoints")))
	}
	if len(s.SourceRanges) > 0 && len(s.LoadBalancerIPs) > 0 {
		out = append(out, f("policy.source-ranges", Info, "the load-balancer IPs accept connections only from %s", prefixes(s.SourceRanges)))
	}
	if s.Affinity != nil {
		out = append(out, f("policy.affinity", Info, "ClientIP session affinity: a client stays with its endpoint for %d s after its last new connection",
			s.Affinity.TimeoutSeconds))
	}
	return out
}

// pluginFindings reports what the hook plugins did to a port.
func pluginFindings(subject string, planned, final *plan.Service, changes []PluginChange) []Finding {
	f := func(code string, sev Severity, format string, args ...any) Finding {
		return Finding{Code: code, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...)}
	}
	if final == nil {
		return []Finding{f("plugins.kept", Warning,
			"a hook plugin whose failure policy is closed failed for this service: the kernel keeps its last good rules, which may be older than the plan")}
	}
	var out []Finding
	for _, ch := range changes {
		if ch.After == nil || ch.Before == nil || ch.After.Key.String() != subject {
			continue
		}
		if what := describeChange(ch.Before, ch.After); what != "" {
			out = append(out, f("plugins.changed", Info, "plugin %s %s", ch.Plugin, what))
		}
	}
	if countEndpoints(planned.Endpoints).forCluster > 0 && countEndpoints(final.Endpoints).forCluster == 0 {
		out = append(out, f("plugins.dropped-all", Broken,
			"the hook plugins left no endpoint to send traffic to: connections to this port are rejected on this node"))
	}
	return out
}

// describeChange says what a plugin changed: dropped endpoints, weights,
// affinity, scheduler; "" when nothing.
func describeChange(before, after *plan.Service) string {
	kept := map[string]uint32{}
	for _, e := range after.Endpoints {
		kept[e.AddrPort().String()] = e.Weight
	}
	var dropped, weights []string
	for _, e := range before.Endpoints {
		w, ok := kept[e.AddrPort().String()]
		switch {
		case !ok:
			dropped = append(dropped, e.AddrPort().String())
		case w != e.Weight:
			weights = append(weights, fmt.Sprintf("%s %d→%d", e.AddrPort(), e.Weight, w))
		}
	}
	var parts []string
	if len(dropped) > 0 {
		parts = append(parts, "dropped "+strings.Join(dropped, ", "))
	}
	if len(weights) > 0 {
		parts = append(parts, "set weights "+strings.Join(weights, ", "))
	}
	if a, b := affinityText(before.Affinity), affinityText(after.Affinity); a != b {
		parts = append(parts, fmt.Sprintf("changed affinity from %s to %s", a, b))
	}
	if before.Scheduler != after.Scheduler {
		parts = append(parts, fmt.Sprintf("asked for scheduler %q", after.Scheduler))
	}
	return strings.Join(parts, "; ")
}

func affinityText(a *plan.Affinity) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("ClientIP %d s", a.TimeoutSeconds)
}

func prefixes[T fmt.Stringer](ps []T) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.String()
	}
	return strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
