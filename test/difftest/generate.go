package difftest

import (
	"fmt"
	"math/rand/v2"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/test/netns"
)

// Generate returns the scenario of seed: 10 to 16 Services of every type
// (ClusterIP, NodePort, LoadBalancer, headless, ExternalName, and some
// labelled for another proxy), with one or two TCP or UDP ports, numbered
// or named target ports, external and load-balancer IPs (ipMode VIP,
// Proxy or unset), source ranges, both traffic policies, ClientIP
// affinity, traffic distribution and hints, and their EndpointSlices:
// endpoints ready, not ready, serving or not while terminating, on this
// node, another or none, split and duplicated across slices, some ports
// named so that they resolve nowhere. Every object is valid, so the API
// server takes it. The same seed gives the same scenario.
func Generate(seed int64) *Scenario {
	g := &generator{r: rand.New(rand.NewPCG(uint64(seed), 0x77656972)), sc: &Scenario{Seed: seed}}
	// Consecutive seeds take different cluster IPs and node ports, so a
	// seed never waits for the API server to free those of the last one.
	g.block = int(uint64(seed) % 50)
	g.node()
	for i := range 10 + g.r.IntN(7) {
		g.service(i)
	}
	return g.sc
}

// generator holds one scenario's random source and allocations.
type generator struct {
	r     *rand.Rand
	sc    *Scenario
	block int
	// nodePorts, extIPs and lbIPs count the allocations so far.
	nodePorts, extIPs, lbIPs int
}

func (g *generator) chance(p float64) bool { return g.r.Float64() < p }

// pick returns one of xs at random.
func pick[T any](g *generator, xs ...T) T { return xs[g.r.IntN(len(xs))] }

// weighted returns i with probability ws[i] (the weights sum to 1).
func (g *generator) weighted(ws ...float64) int {
	x := g.r.Float64()
	for i, w := range ws {
		if x < w {
			return i
		}
		x -= w
	}
	return len(ws) - 1
}

// nodeIP is the node's address in every topology (netns.New's default
// plan): its NodePort address and its IP in the Node object.
var (
	nodeIP    = netns.DefaultClientSubnet.Addr().Next()
	nodeIP6   = netns.DefaultClientSubnet6.Addr().Next()
	podsRange = netns.DefaultPodCIDR
)

func (g *generator) node() {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{}}}
	switch g.weighted(0.7, 0.15, 0.15) {
	case 0:
		n.Labels[corev1.LabelTopologyZone] = zoneA
	case 1:
		n.Labels[corev1.LabelTopologyZone] = zoneB
	}
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: nodeIP.String()},
		{Type: corev1.NodeInternalIP, Address: nodeIP6.String()},
	}
	g.sc.Node = n
}

// The kinds of Service the generator writes.
const (
	kindClusterIP = iota
	kindNodePort
	kindLoadBalancer
	kindHeadless
	kindExternalName
)

func (g *generator) service(i int) {
	kind := g.weighted(0.28, 0.2, 0.34, 0.09, 0.09)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%02d", i), Namespace: namespace, Labels: map[string]string{}}}
	if g.chance(0.08) {
		svc.Labels["service.kubernetes.io/service-proxy-name"] = "another-proxy"
	}
	if kind != kindHeadless && g.chance(0.05) {
		svc.Labels[corev1.IsHeadlessService] = "" // only slices are left out for it
	}
	spec := &svc.Spec
	spec.Ports = g.ports(i)
	switch kind {
	case kindExternalName:
		spec.Type, spec.ExternalName = corev1.ServiceTypeExternalName, "svc.example.com"
	case kindHeadless:
		spec.Type, spec.ClusterIP = corev1.ServiceTypeClusterIP, corev1.ClusterIPNone
		spec.ClusterIPs = []string{corev1.ClusterIPNone}
	default:
		g.addressed(svc, i, kind)
	}
	if kind != kindExternalName {
		single := corev1.IPFamilyPolicySingleStack
		spec.IPFamilyPolicy, spec.IPFamilies = &single, []corev1.IPFamily{corev1.IPv4Protocol}
		if g.chance(0.25) {
			local := corev1.ServiceInternalTrafficPolicyLocal
			spec.InternalTrafficPolicy = &local
		}
	}
	if g.chance(0.25) {
		d := pick(g, corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone,
			corev1.ServiceTrafficDistributionPreferSameNode)
		spec.TrafficDistribution = &d
	}
	g.sc.Services = append(g.sc.Services, svc)
	g.slices(svc, kind)
}

// ports returns one or two service ports, distinct by port and protocol.
func (g *generator) ports(i int) []corev1.ServicePort {
	n := 1 + g.weighted(0.65, 0.35)
	names := []string{"http", "dns", "p1", "web"}
	g.r.Shuffle(len(names), func(a, b int) { names[a], names[b] = names[b], names[a] })
	var out []corev1.ServicePort
	for len(out) < n {
		p := corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: pick(g, int32(80), 443, 53, 8080, int32(9000+i))}
		if g.chance(0.35) {
			p.Protocol = corev1.ProtocolUDP
		}
		if slices.ContainsFunc(out, func(o corev1.ServicePort) bool { return o.Port == p.Port && o.Protocol == p.Protocol }) {
			continue
		}
		if n > 1 || g.chance(0.5) {
			p.Name = names[len(out)]
		}
		p.TargetPort = intstr.FromInt32(pick(g, servedPorts...))
		if g.chance(0.3) {
			p.TargetPort = intstr.FromString(pick(g, "web", "dns"))
		}
		out = append(out, p)
	}
	return out
}

// addressed fills in what a Service with a cluster IP has: the cluster IP,
// node ports, external and load-balancer IPs, source ranges, policies and
// affinity.
func (g *generator) addressed(svc *corev1.Service, i, kind int) {
	spec := &svc.Spec
	ip := fmt.Sprintf("10.96.%d.%d", 1+g.block, 10+i)
	spec.ClusterIP, spec.ClusterIPs = ip, []string{ip}
	spec.Type = corev1.ServiceTypeClusterIP
	switch kind {
	case kindNodePort:
		spec.Type = corev1.ServiceTypeNodePort
	case kindLoadBalancer:
		spec.Type = corev1.ServiceTypeLoadBalancer
	}
	if kind != kindClusterIP {
		g.nodePortsOf(svc, kind)
	}
	if g.chance(0.25) {
		for range 1 + g.r.IntN(2) {
			spec.ExternalIPs = append(spec.ExternalIPs, fmt.Sprintf("192.0.2.%d", 10+g.extIPs))
			g.extIPs++
		}
	}
	if kind == kindLoadBalancer {
		g.loadBalancer(svc)
	}
	if kind != kindClusterIP || len(spec.ExternalIPs) > 0 {
		spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if g.chance(0.4) {
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			if kind == kindLoadBalancer {
				spec.HealthCheckNodePort = g.nodePort()
			}
		}
	}
	if g.chance(0.2) {
		spec.SessionAffinity = corev1.ServiceAffinityClientIP
		spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{
			TimeoutSeconds: pick(g, (*int32)(nil), ptr(int32(30)), ptr(int32(10800)))}}
	}
}

// nodePortsOf gives each port a node port; a LoadBalancer may go without.
func (g *generator) nodePortsOf(svc *corev1.Service, kind int) {
	if kind == kindLoadBalancer && g.chance(0.15) {
		svc.Spec.AllocateLoadBalancerNodePorts = ptr(false)
		return
	}
	for j := range svc.Spec.Ports {
		svc.Spec.Ports[j].NodePort = g.nodePort()
	}
}

// nodePort allocates the next node port of the seed's block.
func (g *generator) nodePort() int32 {
	g.nodePorts++
	return int32(30000 + 50*g.block + g.nodePorts)
}

// sourceRanges are what loadBalancerSourceRanges are drawn from: the
// client's link (client and node), the client alone, the node alone, the
// pods, one pod, and ranges holding nobody.
var sourceRanges = []string{"172.30.0.0/24", "172.30.0.2/32", "172.30.0.1/32", "10.244.0.0/16",
	"10.244.0.12/32", "192.0.2.0/24", "198.51.100.0/24"}

func (g *generator) loadBalancer(svc *corev1.Service) {
	if g.chance(0.9) {
		for range 1 + g.r.IntN(2) {
			ing := corev1.LoadBalancerIngress{IP: fmt.Sprintf("203.0.113.%d", 10+g.lbIPs)}
			g.lbIPs++
			switch g.weighted(0.5, 0.3, 0.2) {
			case 1:
				ing.IPMode = ptr(corev1.LoadBalancerIPModeVIP)
			case 2:
				ing.IPMode = ptr(corev1.LoadBalancerIPModeProxy)
			}
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, ing)
		}
	}
	if g.chance(0.45) {
		for range 1 + g.r.IntN(2) {
			r := pick(g, sourceRanges...)
			if !slices.Contains(svc.Spec.LoadBalancerSourceRanges, r) {
				svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, r)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// slices writes the service's EndpointSlices: none to three, a headless
// or ExternalName service's only sometimes.
func (g *generator) slices(svc *corev1.Service, kind int) {
	n := g.weighted(0.12, 0.55, 0.25, 0.08)
	if (kind == kindHeadless || kind == kindExternalName) && g.chance(0.6) {
		n = 0
	}
	copies := map[string][]discoveryv1.Endpoint{} // the endpoints written so far, by pod
	for j := range n {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", svc.Name, j), Namespace: namespace,
				Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if g.chance(0.06) {
			sl.Labels[corev1.IsHeadlessService] = ""
		}
		sl.Ports = g.slicePorts(svc)
		for _, k := range g.r.Perm(len(pods))[:g.weighted(0.1, 0.3, 0.35, 0.25)] {
			ep := g.duplicate(copies[pods[k].name], svc)
			if ep == nil {
				ep = ptr(g.endpoint(pods[k], svc, g.state()))
			}
			copies[pods[k].name] = append(copies[pods[k].name], *ep)
			sl.Endpoints = append(sl.Endpoints, *ep)
		}
		g.sc.Slices = append(g.sc.Slices, sl)
	}
}

// duplicate returns the endpoint to write for a pod that earlier slices of
// the service already list (copies), or nil when they do not. Like an
// endpoint moving between slices during a rollout, it is either an exact
// copy of the first, or differs in a way that leaves no doubt which copy
// counts: kube-proxy keeps the one copy that is not terminating (the last
// one when several are not, the first when all are, in an order it does
// not define), so a scenario never has two differing copies that are both
// terminating or both not.
func (g *generator) duplicate(copies []discoveryv1.Endpoint, svc *corev1.Service) *discoveryv1.Endpoint {
	if len(copies) == 0 {
		return nil
	}
	if g.chance(0.5) {
		return copies[0].DeepCopy()
	}
	p := pods[slices.IndexFunc(pods, func(p pod) bool { return p.ip.String() == copies[0].Addresses[0] })]
	for _, c := range copies {
		if !isTerminating(c) {
			return ptr(g.endpoint(p, svc, pick(g, stateServingTerminating, stateTerminating)))
		}
	}
	return ptr(g.endpoint(p, svc, pick(g, stateReady, stateReadyOnly, stateNotReady, stateNoConditions)))
}

func isTerminating(ep discoveryv1.Endpoint) bool {
	return ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
}

// The states an endpoint is generated in.
const (
	stateReady              = iota // ready, serving, not terminating
	stateReadyOnly                 // ready, the rest unset
	stateNotReady                  // not ready, not serving, not terminating
	stateServingTerminating        // terminating and still serving
	stateTerminating               // terminating, no longer serving
	stateNoConditions              // nothing set: ready
)

// state draws an endpoint's state.
func (g *generator) state() int {
	return g.weighted(0.45, 0.1, 0.1, 0.15, 0.1, 0.1)
}

// slicePorts returns a slice's ports: each service port's name (now and
// then one that resolves nowhere) with the served port its target names,
// now and then the other served port, or a port left out.
func (g *generator) slicePorts(svc *corev1.Service) []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for j, sp := range svc.Spec.Ports {
		if j > 0 && g.chance(0.05) {
			continue
		}
		port := servedPorts[0]
		switch {
		case sp.TargetPort.Type == intstr.Int:
			port = sp.TargetPort.IntVal
		case sp.TargetPort.StrVal == "dns":
			port = servedPorts[1]
		}
		if g.chance(0.1) {
			port = pick(g, servedPorts...)
		}
		name := sp.Name
		if g.chance(0.08) {
			name = fmt.Sprintf("elsewhere%d", j) // a slice's port names are unique
		}
		out = append(out, discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(sp.Protocol)})
	}
	return out
}

// endpoint returns p as an endpoint of svc in the state given, on this
// node, another or none, with or without hints.
func (g *generator) endpoint(p pod, svc *corev1.Service, state int) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{p.ip.String()}}
	switch state {
	case stateReady:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
	case stateReadyOnly:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(true)}
	case stateNotReady:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(false)}
	case stateServingTerminating:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	case stateTerminating:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(true)}
	}
	zone := zoneB
	switch g.weighted(0.5, 0.4, 0.1) {
	case 0:
		ep.NodeName, zone = ptr(NodeName), zoneA
	case 1:
		ep.NodeName = ptr(otherNode)
	}
	if g.chance(0.85) {
		ep.Zone = ptr(zone)
	}
	if svc.Spec.TrafficDistribution != nil && g.chance(0.8) {
		ep.Hints = g.hints(zone, ep.NodeName, *svc.Spec.TrafficDistribution)
	}
	return ep
}

// hints returns hints as the EndpointSlice controller would write them for
// the distribution: the endpoint's zone (now and then another), and for
// PreferSameNode its node too.
func (g *generator) hints(zone string, node *string, distribution string) *discoveryv1.EndpointHints {
	if g.chance(0.2) {
		zone = pick(g, zoneA, zoneB)
	}
	h := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
	if distribution == corev1.ServiceTrafficDistributionPreferSameNode && node != nil {
		h.ForNodes = []discoveryv1.ForNode{{Name: *node}}
	}
	return h
}
