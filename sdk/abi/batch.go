package abi

import (
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// DecodeBatch decodes a whole batch (node name/zone, services, full flag) without validation
// against anything; for tests, tools and fuzzing (Encode then DecodeBatch round-trips Name/Zone and
// every plan.Service field). It fails when the batch's magic or version is wrong or anything lies
// outside buf.
func DecodeBatch(buf []byte) (node plan.Node, services []*plan.Service, full bool, err error) {
	// The decoded strings share the buffer's memory: decode a private copy,
	// so the caller may reuse buf.
	b, err := Parse(slices.Clone(buf))
	if err != nil {
		return plan.Node{}, nil, false, err
	}
	node = plan.Node{Name: b.NodeName(), Zone: b.NodeZone()}
	services = make([]*plan.Service, b.Len())
	for i := range services {
		services[i] = serviceOf(b.Service(i))
	}
	return node, services, b.Full(), nil
}

// serviceOf builds a plan service from a view.
func serviceOf(v Service) *plan.Service {
	s := &plan.Service{
		Key:                 v.Key(),
		ClusterIPs:          v.ClusterIPs(),
		Port:                v.Port(),
		NodePort:            v.NodePort(),
		ExternalIPs:         v.ExternalIPs(),
		LoadBalancerIPs:     v.LoadBalancerIPs(),
		SourceRanges:        v.SourceRanges(),
		ExternalLocal:       v.ExternalLocal(),
		InternalLocal:       v.InternalLocal(),
		HealthCheckNodePort: v.HealthCheckNodePort(),
		Scheduler:           v.Scheduler(),
	}
	if a := v.AffinitySeconds(); a != 0 {
		s.Affinity = &plan.Affinity{TimeoutSeconds: a}
	}
	sh := v.shape()
	s.Labels = v.pairMap(v.off+sh.pairsOff(), sh.labels)
	s.Annotations = v.pairMap(v.off+sh.pairsOff()+pairSize*sh.labels, sh.annotations)
	if n := v.Len(); n > 0 {
		s.Endpoints = make([]plan.Endpoint, n)
		for i := range s.Endpoints {
			s.Endpoints[i] = endpointOf(v.Endpoint(i))
		}
	}
	return s
}

// pairMap reads n key/value pairs at off; nil when there are none.
func (s Service) pairMap(off, n int) map[string]string {
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	for i := range n {
		p := off + pairSize*i
		m[strAt(s.buf, p)] = strAt(s.buf, p+strSize)
	}
	return m
}

func endpointOf(e Endpoint) plan.Endpoint {
	return plan.Endpoint{
		Address:     e.Address(),
		Port:        e.Port(),
		NodeName:    e.NodeName(),
		Zone:        e.Zone(),
		Pod:         e.Pod(),
		Ready:       e.Ready(),
		Serving:     e.Serving(),
		Terminating: e.Terminating(),
		Local:       e.Local(),
		ForCluster:  e.ForCluster(),
		ForLocal:    e.ForLocal(),
		Weight:      e.Weight(),
	}
}
