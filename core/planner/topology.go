package planner

import "slices"

// topologyFilter narrows cluster traffic to the endpoints whose hints name
// this node or its zone; the zero value allows every endpoint.
type topologyFilter struct {
	node, zone string
}

func (f topologyFilter) allows(c candidate) bool {
	switch {
	case f.node != "":
		return slices.Contains(c.forNodes, f.node)
	case f.zone != "":
		return slices.Contains(c.forZones, f.zone)
	}
	return true
}

// topology decides, like kube-proxy, whether the EndpointSlice hints can be
// followed. The EndpointSlice controller writes them (forNodes for
// trafficDistribution PreferSameNode, forZones for PreferSameZone,
// PreferClose or topology-mode Auto); kube-proxy only reads them. Hints are
// used only when every ready endpoint carries them and at least one names
// this node (node hints) or this node's zone (zone hints); otherwise traffic
// goes to every ready endpoint, so that hints can never black-hole a service.
func topology(cfg Config, all []candidate) topologyFilter {
	allNode, allZone := true, true
	forNode, forZone := false, false
	for _, c := range all {
		if !c.Ready {
			continue
		}
		if len(c.forNodes) == 0 {
			allNode = false
		} else if slices.Contains(c.forNodes, cfg.NodeName) {
			forNode = true
		}
		if len(c.forZones) == 0 {
			allZone = false
		} else if slices.Contains(c.forZones, cfg.Zone) {
			forZone = true
		}
	}
	switch {
	case allNode && forNode && cfg.NodeName != "":
		return topologyFilter{node: cfg.NodeName}
	case allZone && forZone && cfg.Zone != "":
		return topologyFilter{zone: cfg.Zone}
	}
	return topologyFilter{}
}
