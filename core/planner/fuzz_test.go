package planner_test

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
	"github.com/weirproxy/weir/sdk/plan"
)

// FuzzPlan builds Services, EndpointSlices, a Node and the planner's
// configuration from the fuzz bytes, plans them as the proxy does (every
// service, then the claims between them resolved) and checks the plan:
// the same input plans to an equal plan and is left untouched; every
// service port comes from an input Service port and every endpoint from an
// endpoint of one of that service's slices of the right family and port;
// addresses are those of the Service; node ports lie in the range; every
// kernel destination has one holder; endpoints are sorted, unique and
// categorised consistently.
func FuzzPlan(f *testing.F) {
	// No objects at all; two ports of a LoadBalancer with the same node
	// port, equal to its health check node port; any text. More seeds, each
	// named after what it plans, are in testdata/fuzz/FuzzPlan.
	f.Add([]byte{})
	f.Add([]byte("0000100010900100109002102800280"))
	f.Add([]byte("weir planner fuzz: dual stack, node ports, local traffic and hints"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := genInput(data)
		again := genInput(data)
		got := planAll(in)
		if !reflect.DeepEqual(in, again) {
			t.Fatalf("planning modified its input")
		}
		if second := planAll(again); !equalPlans(got, second) {
			t.Fatalf("the same input planned twice differs:\n%s\nvs\n%s", got, second)
		}
		// A handler that takes objects gets them made from the records:
		// they hold everything the planner reads.
		if rebuilt := planAll(viaRecords(genInput(data))); !equalPlans(got, rebuilt) {
			t.Fatalf("the objects made from the records plan differently:\n%s\nvs\n%s", got, rebuilt)
		}
		checkPlan(t, in, got)
	})
}

// fuzzInput is what one fuzz case plans.
type fuzzInput struct {
	cfg    planner.Config
	node   *corev1.Node
	states map[string]objectState
	// configured and objects are the service CIDRs of the configuration
	// and of the ServiceCIDR objects.
	configured, objects []netip.Prefix
}

// objectState is a Service and its EndpointSlices, as objects.
type objectState struct {
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
}

// records returns the records the sources make of in's objects.
func (in fuzzInput) records() (*source.Node, map[string]tracker.ServiceState) {
	c := source.NewCompactor()
	out := map[string]tracker.ServiceState{}
	for name, st := range in.states {
		r := tracker.ServiceState{Service: c.Service(st.Service)}
		for _, s := range st.Slices {
			r.Slices = append(r.Slices, c.EndpointSlice(s))
		}
		out[name] = r
	}
	return c.Node(in.node), out
}

// viaRecords replaces in's objects with the objects made from their
// records, as a handler that takes objects gets them.
func viaRecords(in fuzzInput) fuzzInput {
	node, states := in.records()
	in.node = node.Object()
	for name, st := range states {
		o := objectState{Service: st.Service.Object()}
		for _, s := range st.Slices {
			o.Slices = append(o.Slices, s.Object())
		}
		in.states[name] = o
	}
	return in
}

// planned is the plan of a fuzz input, with the problems reported.
type planned struct {
	plan     *plan.Plan
	problems []planner.Problem
}

func (p *planned) String() string {
	var b strings.Builder
	b.WriteString(p.plan.String())
	for _, pr := range p.problems {
		fmt.Fprintf(&b, "problem: %s\n", pr)
	}
	return b.String()
}

// planAll plans every service in name order, then gives each contested
// destination to one service port, as core/proxy does.
func planAll(in fuzzInput) *planned {
	node, states := in.records()
	out := &planned{plan: &plan.Plan{
		Node:         planner.Node(in.cfg.NodeName, node),
		Services:     map[plan.Key]*plan.Service{},
		ServiceCIDRs: planner.ServiceCIDRs(in.configured, in.objects),
	}}
	cfg := in.cfg
	cfg.Zone = out.plan.Node.Zone
	claims := planner.NewClaims()
	var raw []*plan.Service
	for _, name := range slices.Sorted(maps.Keys(states)) {
		st := states[name]
		services, problems := planner.Service(cfg, st)
		out.problems = append(out.problems, problems...)
		for _, s := range services {
			var created time.Time
			if st.Service != nil {
				created = st.Service.Created
			}
			claims.Set(s.Key, s, created)
			raw = append(raw, s)
		}
	}
	for _, s := range raw {
		r, problems := claims.Resolve(s)
		out.problems = append(out.problems, problems...)
		out.plan.Services[r.Key] = r
	}
	return out
}

func equalPlans(a, b *planned) bool {
	return a.plan.Node.Name == b.plan.Node.Name && a.plan.Node.Zone == b.plan.Node.Zone &&
		slices.Equal(a.plan.Node.Addresses, b.plan.Node.Addresses) && slices.Equal(a.plan.Node.PodCIDRs, b.plan.Node.PodCIDRs) &&
		slices.Equal(a.plan.ServiceCIDRs, b.plan.ServiceCIDRs) &&
		maps.EqualFunc(a.plan.Services, b.plan.Services, (*plan.Service).Equal) && slices.Equal(a.problems, b.problems)
}

// checkPlan checks the plan of in against its input.
func checkPlan(t *testing.T, in fuzzInput, got *planned) {
	t.Helper()
	checkNode(t, in, got.plan.Node)
	checkServiceCIDRs(t, in, got.plan.ServiceCIDRs)
	for _, k := range got.plan.Keys() {
		s := got.plan.Services[k]
		st := in.states[k.Namespace+"/"+k.Name]
		if st.Service == nil {
			t.Fatalf("%s: no input Service %s/%s", k, k.Namespace, k.Name)
		}
		if why := checkService(in.cfg, st.Service, s); why != "" {
			t.Fatalf("%s: %s\n%s", k, why, got)
		}
		if why := checkEndpoints(in.cfg, st, s); why != "" {
			t.Fatalf("%s: %s\n%s", k, why, got)
		}
	}
	if why := checkClaims(got.plan); why != "" {
		t.Fatalf("%s\n%s", why, got)
	}
	for _, p := range got.problems {
		if p.Field == "" || p.Reason == "" ||
			(!strings.HasPrefix(p.Object, "Service ") && !strings.HasPrefix(p.Object, "EndpointSlice ")) {
			t.Fatalf("problem %q does not name an object, a field and a reason", p)
		}
	}
}

// checkNode checks that the node's addresses are input addresses, at most
// one per family, and its pod CIDRs input CIDRs.
func checkNode(t *testing.T, in fuzzInput, n plan.Node) {
	t.Helper()
	if n.Name != in.cfg.NodeName {
		t.Fatalf("node name %q, configured %q", n.Name, in.cfg.NodeName)
	}
	if len(n.Addresses) > 2 || (len(n.Addresses) == 2 && n.Addresses[0].Is4() == n.Addresses[1].Is4()) {
		t.Fatalf("node addresses %v: more than one per family", n.Addresses)
	}
	var addrs, cidrs []string
	if in.node != nil {
		for _, a := range in.node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				addrs = append(addrs, a.Address)
			}
		}
		cidrs = in.node.Spec.PodCIDRs
	}
	for _, a := range n.Addresses {
		if !slices.ContainsFunc(addrs, func(s string) bool { return sameAddr(s, a) }) {
			t.Fatalf("node address %s is none of the Node's IPs %q", a, addrs)
		}
	}
	for _, p := range n.PodCIDRs {
		if !slices.ContainsFunc(cidrs, func(s string) bool { q, err := netip.ParsePrefix(s); return err == nil && q == p }) {
			t.Fatalf("pod CIDR %s is none of the Node's %q", p, cidrs)
		}
	}
}

// checkServiceCIDRs checks that the service CIDRs are the masked input
// ranges, sorted, each once.
func checkServiceCIDRs(t *testing.T, in fuzzInput, cidrs []netip.Prefix) {
	t.Helper()
	all := slices.Concat(in.configured, in.objects)
	for i, p := range cidrs {
		if i > 0 && cidrs[i-1].Compare(p) >= 0 {
			t.Fatalf("service CIDRs %v are not sorted or repeat one", cidrs)
		}
		if p != p.Masked() || !slices.ContainsFunc(all, func(q netip.Prefix) bool { return q.Masked() == p }) {
			t.Fatalf("service CIDR %s is not the masked form of an input range of %v", p, all)
		}
	}
	if len(all) > 0 && len(cidrs) == 0 {
		t.Fatalf("service CIDRs %v gave none", all)
	}
}

// sameAddr reports whether the text s is the address a.
func sameAddr(s string, a netip.Addr) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Unmap() == a
}

// checkService returns why the plan service s does not match the Service
// it comes from, or "".
func checkService(cfg planner.Config, svc *corev1.Service, s *plan.Service) string {
	_, other := svc.Labels[planner.LabelServiceProxyName]
	if other || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return "planned a Service Weir does not proxy"
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == s.Key.Port && cmpProtocol(p.Protocol) == s.Key.Protocol && int32(s.Port) == p.Port
	})
	if i < 0 {
		return "no port of the Service has this name, protocol and port"
	}
	port := svc.Spec.Ports[i]
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	var ingress []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IPMode == nil || *in.IPMode != corev1.LoadBalancerIPModeProxy {
			ingress = append(ingress, in.IP)
		}
	}
	for _, l := range []struct {
		name  string
		got   []netip.Addr
		input []string
	}{{"cluster IP", s.ClusterIPs, clusterIPs}, {"external IP", s.ExternalIPs, svc.Spec.ExternalIPs},
		{"load-balancer IP", s.LoadBalancerIPs, ingress}} {
		for j, a := range l.got {
			if !slices.ContainsFunc(l.input, func(x string) bool { return sameAddr(x, a) }) || slices.Index(l.got, a) != j {
				return fmt.Sprintf("%s %s is not in the Service or listed twice", l.name, a)
			}
		}
	}
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	switch {
	case s.NodePort != 0 && (!nodePorts || int32(s.NodePort) != port.NodePort || !cfg.NodePorts.Contains(s.NodePort)):
		return fmt.Sprintf("node port %d is not the port's, or the Service has none, or it is out of range", s.NodePort)
	case s.HealthCheckNodePort != 0 && (!s.ExternalLocal || svc.Spec.Type != corev1.ServiceTypeLoadBalancer ||
		int32(s.HealthCheckNodePort) != svc.Spec.HealthCheckNodePort || !cfg.NodePorts.Contains(s.HealthCheckNodePort)):
		return fmt.Sprintf("health check node port %d without a LoadBalancer with local external traffic", s.HealthCheckNodePort)
	case len(s.SourceRanges) > 0 && svc.Spec.Type != corev1.ServiceTypeLoadBalancer:
		return "source ranges on a Service that is not a LoadBalancer"
	case (s.Affinity != nil) != (svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP):
		return "affinity does not follow spec.sessionAffinity"
	}
	return ""
}

func cmpProtocol(p corev1.Protocol) plan.Protocol {
	if p == "" {
		return plan.TCP
	}
	return plan.Protocol(p)
}

// checkEndpoints returns why the endpoints of s are not the ones of the
// service's slices, well ordered and categorised, or "".
func checkEndpoints(cfg planner.Config, st objectState, s *plan.Service) string {
	for j, e := range s.Endpoints {
		if j > 0 && s.Endpoints[j-1].AddrPort().Compare(e.AddrPort()) >= 0 {
			return fmt.Sprintf("endpoints %s and %s are out of order or repeated", s.Endpoints[j-1].AddrPort(), e.AddrPort())
		}
		if !fromSlices(st.Slices, s.Key, e) {
			return fmt.Sprintf("endpoint %s is no endpoint of a slice of the service with its family, port name and protocol", e.AddrPort())
		}
		switch {
		case e.Weight != 1:
			return fmt.Sprintf("endpoint %s has weight %d", e.AddrPort(), e.Weight)
		case e.Local != (e.NodeName != "" && e.NodeName == cfg.NodeName):
			return fmt.Sprintf("endpoint %s on node %q is wrongly marked local", e.AddrPort(), e.NodeName)
		case e.ForLocal && !e.Local:
			return fmt.Sprintf("endpoint %s serves local traffic from another node", e.AddrPort())
		case !e.Ready && (!e.Serving || !e.Terminating):
			return fmt.Sprintf("endpoint %s is neither ready nor serving while terminating", e.AddrPort())
		}
	}
	for _, fam := range [][]plan.Endpoint{s.Endpoints[:split(s.Endpoints)], s.Endpoints[split(s.Endpoints):]} {
		if why := checkCategories(s, fam); why != "" {
			return why
		}
	}
	return ""
}

// split returns the index of the first IPv6 endpoint, or len(eps).
func split(eps []plan.Endpoint) int {
	if i := slices.IndexFunc(eps, func(e plan.Endpoint) bool { return e.Address.Is6() }); i >= 0 {
		return i
	}
	return len(eps)
}

// checkCategories returns why the endpoints of one family are categorised
// wrongly, or "". Each policy's endpoints are all ready or all fallbacks,
// and a policy in use with ready candidates picks some of them.
func checkCategories(s *plan.Service, fam []plan.Endpoint) string {
	if slices.ContainsFunc(fam, func(e plan.Endpoint) bool { return e.Address.Is4() != fam[0].Address.Is4() }) {
		return "IPv6 endpoints come before IPv4 ones"
	}
	external := s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
	for _, c := range []struct {
		name     string
		used     bool
		chosen   func(plan.Endpoint) bool
		eligible func(plan.Endpoint) bool
	}{
		{"cluster", !s.InternalLocal || external,
			func(e plan.Endpoint) bool { return e.ForCluster }, func(e plan.Endpoint) bool { return e.Ready }},
		{"local", s.InternalLocal || (external && s.ExternalLocal),
			func(e plan.Endpoint) bool { return e.ForLocal }, func(e plan.Endpoint) bool { return e.Local && e.Ready }},
	} {
		ready, fallback, eligible := 0, 0, false
		for _, e := range fam {
			eligible = eligible || c.eligible(e)
			if c.chosen(e) && e.Ready {
				ready++
			} else if c.chosen(e) {
				fallback++
			}
		}
		switch {
		case ready > 0 && fallback > 0:
			return fmt.Sprintf("%s traffic goes to ready and to terminating endpoints", c.name)
		case c.used && eligible && ready == 0:
			return fmt.Sprintf("%s traffic goes to no ready endpoint though there are some", c.name)
		}
	}
	return ""
}

// fromSlices reports whether e is the first address of an endpoint of one
// of the slices, whose address type is e's family and whose port for the
// key's name and protocol is e's port.
func fromSlices(list []*discoveryv1.EndpointSlice, k plan.Key, e plan.Endpoint) bool {
	for _, sl := range list {
		if (sl.AddressType == discoveryv1.AddressTypeIPv4) != e.Address.Is4() ||
			(sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		if !slices.ContainsFunc(sl.Ports, func(p discoveryv1.EndpointPort) bool {
			proto := plan.TCP
			if p.Protocol != nil {
				proto = plan.Protocol(*p.Protocol)
			}
			return deref(p.Name) == k.Port && proto == k.Protocol && p.Port != nil && *p.Port == int32(e.Port)
		}) {
			continue
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) > 0 && sameAddr(ep.Addresses[0], e.Address) {
				return true
			}
		}
	}
	return false
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// holder is a service port holding a destination, through its node port
// or its health check node port.
type holder struct {
	key         plan.Key
	healthCheck bool
}

// checkClaims returns why two service ports of the plan hold one kernel
// destination, or "". An address, protocol and port has one holder. A node
// port has one holder through its node port; the ports of that Service
// may share it as their health check node port.
func checkClaims(p *plan.Plan) string {
	ips := map[string]plan.Key{}
	nodePorts := map[string][]holder{}
	for _, k := range p.Keys() {
		s := p.Services[k]
		mine := map[string]bool{}
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			c := fmt.Sprintf("%s/%s", netip.AddrPortFrom(a, s.Port), k.Protocol)
			if o, taken := ips[c]; taken && !mine[c] {
				return fmt.Sprintf("%s is held by both %s and %s", c, o, k)
			}
			ips[c], mine[c] = k, true
		}
		if s.NodePort != 0 {
			c := fmt.Sprintf("%d/%s", s.NodePort, k.Protocol)
			nodePorts[c] = append(nodePorts[c], holder{k, false})
		}
		if s.HealthCheckNodePort != 0 {
			c := fmt.Sprintf("%d/%s", s.HealthCheckNodePort, plan.TCP)
			nodePorts[c] = append(nodePorts[c], holder{k, true})
		}
	}
	for _, c := range slices.Sorted(maps.Keys(nodePorts)) {
		hs := nodePorts[c]
		n := 0
		for _, h := range hs {
			if !h.healthCheck {
				n++
			}
			if h.key.Namespace != hs[0].key.Namespace || h.key.Name != hs[0].key.Name {
				return fmt.Sprintf("node port %s is held by ports of two Services: %v", c, hs)
			}
		}
		if n > 1 {
			return fmt.Sprintf("node port %s is the node port of %d service ports: %v", c, n, hs)
		}
	}
	return ""
}

// gen draws choices from the fuzz bytes; once they run out, every choice
// is the first option.
type gen struct{ data []byte }

// n returns a number in [0, max).
func (g *gen) n(max int) int {
	if len(g.data) == 0 {
		return 0
	}
	b := g.data[0]
	g.data = g.data[1:]
	return int(b) % max
}

func (g *gen) bool() bool { return g.n(2) == 1 }

// pick returns one of options.
func pick[T any](g *gen, options ...T) T { return options[g.n(len(options))] }

// some returns zero to max picks of options.
func some[T any](g *gen, max int, options ...T) []T {
	var out []T
	for range g.n(max + 1) {
		out = append(out, pick(g, options...))
	}
	return out
}

// optional returns nil or a pointer to one of options.
func optional[T any](g *gen, options ...T) *T {
	if !g.bool() {
		return nil
	}
	v := pick(g, options...)
	return &v
}

// The small pools inputs are drawn from, so that names, addresses and
// ports collide.
var (
	fuzzNamespaces    = []string{"default", "shop"}
	fuzzNames         = []string{"web", "db", "dns"}
	fuzzNodes         = []string{"node-a", "node-b", ""}
	fuzzZones         = []string{"zone-a", "zone-b", ""}
	fuzzIPs           = []string{"10.96.0.1", "10.96.0.2", "fd00::1", "::ffff:10.96.0.2", "None", "", "10.96.0.300", "192.0.2.1"}
	fuzzEndpoints     = []string{"10.0.0.1", "10.0.0.2", "fd00::a", "fd00::b", "::ffff:10.0.0.1", "bad", ""}
	fuzzIPv4Endpoints = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "::ffff:10.0.0.1"}
	fuzzIPv6Endpoints = []string{"fd00::a", "fd00::b", "fd00::c"}
	fuzzPortNames     = []string{"", "http", "dns"}
	fuzzTimes         = []time.Time{{}, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)}
)

// genInput derives a whole fuzz input from data; the same data always
// gives an equal input.
func genInput(data []byte) fuzzInput {
	g := &gen{data: data}
	in := fuzzInput{states: map[string]objectState{}}
	in.cfg.NodeName = pick(g, "node-a", "node-a", "node-b", "")
	in.cfg.NodePorts = pick(g, planner.PortRange{}, planner.PortRange{First: 30000, Last: 32767})
	if g.n(4) != 0 {
		in.node = genNode(g)
	}
	for range g.n(5) {
		svc := genService(g)
		key := svc.Namespace + "/" + svc.Name
		st := in.states[key]
		st.Service = svc
		in.states[key] = st
	}
	var services []*corev1.Service
	for _, st := range in.states {
		services = append(services, st.Service)
	}
	slices.SortFunc(services, func(a, b *corev1.Service) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	for range g.n(6) {
		sl := genSlice(g, services)
		key := sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]
		st := in.states[key]
		st.Slices = append(st.Slices, sl)
		in.states[key] = st
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.96.7.1/16"),
		netip.MustParsePrefix("fd00:96::/112"), netip.MustParsePrefix("10.96.0.0/12")}
	in.configured, in.objects = some(g, 2, cidrs...), some(g, 3, cidrs...)
	return in
}

// genNode returns a Node with a zone, addresses of every kind and pod CIDRs.
func genNode(g *gen) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pick(g, fuzzNodes...)}}
	if z := pick(g, fuzzZones...); z != "" {
		n.Labels = map[string]string{corev1.LabelTopologyZone: z}
	}
	for range g.n(4) {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{
			Type:    pick(g, corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName),
			Address: pick(g, "192.168.1.1", "192.168.1.2", "fd00:1::1", "::ffff:192.168.1.3", "node-a", "bad"),
		})
	}
	n.Spec.PodCIDRs = some(g, 2, "10.244.0.0/24", "fd00:10:244::/64", "10.244.1.0/33")
	return n
}

// genService returns a Service of any type, with addresses, policies,
// affinity, ports and load-balancer ingress drawn from the pools.
func genService(g *gen) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Namespace:         pick(g, fuzzNamespaces...),
		Name:              pick(g, fuzzNames...),
		CreationTimestamp: metav1.NewTime(pick(g, fuzzTimes...)),
	}}
	switch g.n(6) {
	case 1:
		svc.Labels = map[string]string{planner.LabelServiceProxyName: "other"}
	case 2:
		// Only the EndpointSlice controller's slices of headless services
		// carry it; on a Service it means nothing to kube-proxy.
		svc.Labels = map[string]string{corev1.IsHeadlessService: ""}
	case 3:
		svc.Labels = map[string]string{"app": "web"}
	}
	if g.bool() {
		svc.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}", "a": pick(g, "x", "y")}
	}
	spec := &svc.Spec
	spec.Type = pick(g, corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer,
		corev1.ServiceTypeExternalName, "")
	spec.ClusterIP = pick(g, fuzzIPs...)
	spec.ClusterIPs = some(g, 2, fuzzIPs...)
	spec.ExternalIPs = some(g, 2, fuzzIPs...)
	spec.LoadBalancerSourceRanges = some(g, 2, "203.0.113.0/24", "203.0.113.7/24", "fd00::/8", "bad")
	spec.ExternalTrafficPolicy = pick(g, corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal, "")
	spec.InternalTrafficPolicy = optional(g, corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal)
	spec.HealthCheckNodePort = pick[int32](g, 0, 31000, 30080, 80, 70000)
	spec.SessionAffinity = pick(g, corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP, "")
	if g.bool() {
		spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{
			TimeoutSeconds: optional[int32](g, 0, -5, 100, 86400)}}
	}
	for range g.n(4) {
		spec.Ports = append(spec.Ports, corev1.ServicePort{
			Name:     pick(g, fuzzPortNames...),
			Protocol: pick(g, corev1.ProtocolTCP, corev1.ProtocolUDP, "", corev1.ProtocolTCP, corev1.ProtocolSCTP, "ICMP"),
			Port:     pick[int32](g, 80, 53, 443, 80, 53, 0, 70000),
			NodePort: pick[int32](g, 0, 30080, 31000, 80, 70000),
		})
	}
	for range g.n(3) {
		var mode *corev1.LoadBalancerIPMode
		if m := pick(g, "", corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy); m != "" {
			mode = &m
		}
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress,
			corev1.LoadBalancerIngress{IP: pick(g, fuzzIPs...), IPMode: mode})
	}
	return svc
}

// genSlice returns a slice, most often for one of the services and with
// ports of it, so that its endpoints reach the plan.
func genSlice(g *gen, services []*corev1.Service) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pick(g, fuzzNamespaces...),
			Name:      pick(g, "s1", "s2", "s3"),
			Labels:    map[string]string{discoveryv1.LabelServiceName: pick(g, fuzzNames...)},
		},
		AddressType: pick(g, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN),
	}
	var svc *corev1.Service
	if len(services) > 0 && g.n(4) != 0 {
		svc = pick(g, services...)
		sl.Namespace, sl.Labels[discoveryv1.LabelServiceName] = svc.Namespace, svc.Name
	}
	if svc != nil {
		for _, p := range svc.Spec.Ports {
			if g.n(4) != 0 {
				sl.Ports = append(sl.Ports, slicePort(g, p))
			}
		}
	}
	for range g.n(3) {
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{
			Name:     optional(g, fuzzPortNames...),
			Protocol: optional(g, corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP),
			Port:     optional[int32](g, 8080, 53, 0, 70000),
		})
	}
	for range g.n(5) {
		sl.Endpoints = append(sl.Endpoints, genEndpoint(g, sl.AddressType))
	}
	return sl
}

// slicePort returns the port of a slice for the service port p: its name
// and protocol, and most often a valid port.
func slicePort(g *gen, p corev1.ServicePort) discoveryv1.EndpointPort {
	out := discoveryv1.EndpointPort{Port: optional[int32](g, 8080, 53, 0)}
	if out.Port == nil {
		out.Port = &p.Port
	}
	if name := p.Name; name != "" || g.bool() {
		out.Name = &name
	}
	if proto := p.Protocol; proto != "" {
		out.Protocol = &proto
	}
	return out
}

// genEndpoint returns an endpoint of a slice of the address family.
func genEndpoint(g *gen, family discoveryv1.AddressType) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses: endpointAddresses(g, family),
		Conditions: discoveryv1.EndpointConditions{
			Ready:       optional(g, true, false),
			Serving:     optional(g, true, false),
			Terminating: optional(g, true, false),
		},
		NodeName: optional(g, "node-a", "node-b", "node-a", ""),
		Zone:     optional(g, fuzzZones...),
	}
	if g.bool() {
		e.TargetRef = &corev1.ObjectReference{Kind: pick(g, "Pod", "", "Node"), Name: pick(g, "pod-1", "pod-2")}
	}
	if g.n(3) != 0 {
		e.Hints = &discoveryv1.EndpointHints{}
		for _, z := range some(g, 2, fuzzZones...) {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
		for _, n := range some(g, 2, fuzzNodes...) {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
	return e
}

// endpointAddresses returns the addresses of an endpoint: most often one of
// the family, sometimes two, one of any family or none.
func endpointAddresses(g *gen, family discoveryv1.AddressType) []string {
	addrs := fuzzIPv4Endpoints
	if family == discoveryv1.AddressTypeIPv6 {
		addrs = fuzzIPv6Endpoints
	}
	switch g.n(6) {
	case 0, 1, 2:
		return []string{pick(g, addrs...)}
	case 3:
		return []string{pick(g, addrs...), pick(g, addrs...)}
	case 4:
		return []string{pick(g, fuzzEndpoints...)}
	}
	return nil
}
