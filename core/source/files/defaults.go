package files

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The files source applies the defaults the API server would apply on create,
// so consumers see the same shape of object as from a real cluster. Only
// defaults that need no allocation are applied: a Service without a cluster IP
// in its manifest gets none here. Fields the source's Trimmer drops get no
// default (a port's targetPort, ipFamilies, allocateLoadBalancerNodePorts).

// defaultService mirrors SetDefaults_Service and the cluster IP fields the API
// server fills in.
func defaultService(svc *corev1.Service) {
	spec := &svc.Spec
	if spec.Type == "" {
		spec.Type = corev1.ServiceTypeClusterIP
	}
	defaultAffinity(spec)
	for i := range spec.Ports {
		if p := &spec.Ports[i]; p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
	}
	if externallyAccessible(spec) && spec.ExternalTrafficPolicy == "" {
		spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if spec.InternalTrafficPolicy == nil && spec.Type != corev1.ServiceTypeExternalName {
		policy := corev1.ServiceInternalTrafficPolicyCluster
		spec.InternalTrafficPolicy = &policy
	}
	defaultClusterIPs(spec)
	defaultIngressIPMode(&svc.Status.LoadBalancer)
}

// defaultAffinity sets session affinity to None, or gives ClientIP affinity
// the default timeout.
func defaultAffinity(spec *corev1.ServiceSpec) {
	switch spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		spec.SessionAffinity = corev1.ServiceAffinityNone
		spec.SessionAffinityConfig = nil
	case corev1.ServiceAffinityClientIP:
		cfg := spec.SessionAffinityConfig
		if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
			timeout := corev1.DefaultClientIPServiceAffinitySeconds
			spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
				ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout},
			}
		}
	}
}

// externallyAccessible reports whether traffic can reach the service from
// outside the cluster, which is when externalTrafficPolicy applies.
func externallyAccessible(spec *corev1.ServiceSpec) bool {
	return spec.Type == corev1.ServiceTypeLoadBalancer ||
		spec.Type == corev1.ServiceTypeNodePort ||
		(spec.Type == corev1.ServiceTypeClusterIP && len(spec.ExternalIPs) > 0)
}

// defaultClusterIPs keeps clusterIP and clusterIPs consistent.
func defaultClusterIPs(spec *corev1.ServiceSpec) {
	if len(spec.ClusterIPs) == 0 && spec.ClusterIP != "" {
		spec.ClusterIPs = []string{spec.ClusterIP}
	}
	if spec.ClusterIP == "" && len(spec.ClusterIPs) > 0 {
		spec.ClusterIP = spec.ClusterIPs[0]
	}
}

// defaultIngressIPMode marks load-balancer ingress IPs without an ipMode as VIP.
func defaultIngressIPMode(lb *corev1.LoadBalancerStatus) {
	for i := range lb.Ingress {
		ing := &lb.Ingress[i]
		if ing.IP != "" && ing.IPMode == nil {
			mode := corev1.LoadBalancerIPModeVIP
			ing.IPMode = &mode
		}
	}
}

// defaultEndpointSlice mirrors SetDefaults_EndpointPort: ports get an empty
// name and the TCP protocol when unset.
func defaultEndpointSlice(slice *discoveryv1.EndpointSlice) {
	for i := range slice.Ports {
		p := &slice.Ports[i]
		if p.Name == nil {
			name := ""
			p.Name = &name
		}
		if p.Protocol == nil {
			proto := corev1.ProtocolTCP
			p.Protocol = &proto
		}
	}
}
