package difftest

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/test/netns"
)

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := Generate(7).Manifests(), Generate(7).Manifests()
	if a != b {
		t.Fatal("seed 7 gave two different scenarios")
	}
	if a == Generate(8).Manifests() {
		t.Fatal("seeds 7 and 8 gave the same scenario")
	}
}

// TestGenerateCoversTheFields checks that twenty seeds, what make
// difftest runs, write every field the planner reads at least once.
func TestGenerateCoversTheFields(t *testing.T) {
	seen := map[string]bool{}
	for seed := int64(1); seed <= 20; seed++ {
		sc := Generate(seed)
		if n := len(sc.Services); n < 10 || n > 16 {
			t.Errorf("seed %d: %d services, want 10 to 16", seed, n)
		}
		for _, s := range sc.Services {
			coverService(seen, s)
		}
		addrs := map[string]int{}
		for _, sl := range sc.Slices {
			coverSlice(seen, sl)
			for _, ep := range sl.Endpoints {
				addrs[sl.Labels[discoveryv1.LabelServiceName]+"/"+ep.Addresses[0]]++
			}
		}
		for _, n := range addrs {
			seen["an address in two slices"] = seen["an address in two slices"] || n > 1
		}
	}
	for _, want := range []string{"ClusterIP", "NodePort", "LoadBalancer", "headless", "ExternalName",
		"service-proxy-name", "UDP", "two ports", "named target port", "external IPs", "ipMode Proxy",
		"ipMode VIP", "no ipMode", "source ranges", "externalTrafficPolicy Local", "health-check node port",
		"internalTrafficPolicy Local", "ClientIP affinity", "trafficDistribution", "no node ports",
		"ready", "not ready", "serving terminating", "terminating", "no conditions", "local", "remote",
		"no node", "hints", "forNodes", "unresolved port", "headless slice", "no endpoints", "an address in two slices"} {
		if !seen[want] {
			t.Errorf("twenty seeds never generate %s", want)
		}
	}
}

func coverService(seen map[string]bool, s *corev1.Service) {
	spec := s.Spec
	switch {
	case spec.ClusterIP == corev1.ClusterIPNone:
		seen["headless"] = true
	case spec.Type == corev1.ServiceTypeExternalName:
		seen["ExternalName"] = true
	default:
		seen[string(spec.Type)] = true
	}
	_, other := s.Labels["service.kubernetes.io/service-proxy-name"]
	seen["service-proxy-name"] = seen["service-proxy-name"] || other
	seen["two ports"] = seen["two ports"] || len(spec.Ports) == 2
	for _, p := range spec.Ports {
		seen[string(p.Protocol)] = true
		seen["named target port"] = seen["named target port"] || p.TargetPort.StrVal != ""
	}
	seen["external IPs"] = seen["external IPs"] || len(spec.ExternalIPs) > 0
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IPMode == nil {
			seen["no ipMode"] = true
		} else {
			seen["ipMode "+string(*ing.IPMode)] = true
		}
	}
	seen["source ranges"] = seen["source ranges"] || len(spec.LoadBalancerSourceRanges) > 0
	seen["externalTrafficPolicy Local"] = seen["externalTrafficPolicy Local"] || spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	seen["health-check node port"] = seen["health-check node port"] || spec.HealthCheckNodePort != 0
	seen["internalTrafficPolicy Local"] = seen["internalTrafficPolicy Local"] || spec.InternalTrafficPolicy != nil
	seen["ClientIP affinity"] = seen["ClientIP affinity"] || spec.SessionAffinity == corev1.ServiceAffinityClientIP
	seen["trafficDistribution"] = seen["trafficDistribution"] || spec.TrafficDistribution != nil
	seen["no node ports"] = seen["no node ports"] || spec.AllocateLoadBalancerNodePorts != nil
}

func coverSlice(seen map[string]bool, sl *discoveryv1.EndpointSlice) {
	_, headless := sl.Labels[corev1.IsHeadlessService]
	seen["headless slice"] = seen["headless slice"] || headless
	seen["no endpoints"] = seen["no endpoints"] || len(sl.Endpoints) == 0
	for _, p := range sl.Ports {
		seen["unresolved port"] = seen["unresolved port"] || strings.HasPrefix(*p.Name, "elsewhere")
	}
	for _, ep := range sl.Endpoints {
		c := ep.Conditions
		switch {
		case c.Ready == nil:
			seen["no conditions"] = true
		case *c.Ready:
			seen["ready"] = true
		case c.Terminating != nil && *c.Terminating && *c.Serving:
			seen["serving terminating"] = true
		case c.Terminating != nil && *c.Terminating:
			seen["terminating"] = true
		default:
			seen["not ready"] = true
		}
		switch {
		case ep.NodeName == nil:
			seen["no node"] = true
		case *ep.NodeName == NodeName:
			seen["local"] = true
		default:
			seen["remote"] = true
		}
		seen["hints"] = seen["hints"] || ep.Hints != nil
		seen["forNodes"] = seen["forNodes"] || ep.Hints != nil && len(ep.Hints.ForNodes) > 0
	}
}

// TestGenerateAllocatesOnce checks that no two services of a scenario
// share a cluster IP, node port, external or load-balancer IP (the API
// server would refuse the first two; the others would be conflicts the
// proxies resolve differently on purpose), and that node ports lie in
// the API server's default range.
func TestGenerateAllocatesOnce(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		taken := map[string]string{}
		claim := func(what, owner string) {
			if prev, ok := taken[what]; ok {
				t.Errorf("seed %d: %s and %s both have %s", seed, prev, owner, what)
			}
			taken[what] = owner
		}
		for _, s := range Generate(seed).Services {
			if ip := s.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
				claim("cluster IP "+ip, s.Name)
			}
			for _, a := range append(append([]string{}, s.Spec.ExternalIPs...), ingressIPs(s)...) {
				claim("address "+a, s.Name)
			}
			ports := []int32{s.Spec.HealthCheckNodePort}
			for _, p := range s.Spec.Ports {
				ports = append(ports, p.NodePort)
			}
			for _, p := range ports {
				if p == 0 {
					continue
				}
				if p < 30000 || p > 32767 {
					t.Errorf("seed %d: %s has node port %d", seed, s.Name, p)
				}
				claim(fmt.Sprint("node port ", p), s.Name)
			}
		}
	}
}

// TestGenerateSlicePortsAreUnique checks what the API server requires of
// a slice's ports: distinct names.
func TestGenerateSlicePortsAreUnique(t *testing.T) {
	for seed := int64(1); seed <= 200; seed++ {
		for _, sl := range Generate(seed).Slices {
			names := map[string]bool{}
			for _, p := range sl.Ports {
				if names[*p.Name] {
					t.Errorf("seed %d: slice %s has two ports named %q", seed, sl.Name, *p.Name)
				}
				names[*p.Name] = true
			}
		}
	}
}

func ingressIPs(s *corev1.Service) []string {
	var out []string
	for _, ing := range s.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	return out
}

func TestProbesAreNamedOnce(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		ids := map[string]bool{}
		probes := Probes(Generate(seed))
		for _, p := range probes {
			if ids[p.ID] {
				t.Errorf("seed %d: two probes are %q", seed, p.ID)
			}
			ids[p.ID] = true
		}
		if len(probes) < 50 {
			t.Errorf("seed %d: only %d probes", seed, len(probes))
		}
	}
}

func TestTallyStops(t *testing.T) {
	namer := func(a netip.Addr) string { return a.String() }
	answer := func(pod string) netns.Answer {
		return netns.Answer{Pod: pod, Source: netip.MustParseAddrPort("172.30.0.1:4000")}
	}
	p := Probe{Candidates: []string{"pod-a", "pod-b"}}
	cases := []struct {
		name  string
		probe Probe
		feed  func(t *tally)
		want  int // attempts made when done
	}{
		{"three failures, nobody to answer", Probe{}, func(t *tally) { t.add(netns.Answer{}, netns.ErrTimeout, namer) }, failedAttempts},
		{"failures, then a burst", p, func(t *tally) {
			n := 1
			if t.burst(p) {
				n = burstAttempts
			}
			for range n {
				t.add(netns.Answer{}, netns.ErrTimeout, namer)
			}
		}, failedAttempts + burstAttempts},
		{"every candidate answers", p, func(t *tally) {
			t.add(answer([]string{"pod-a", "pod-b"}[t.attempts%2]), nil, namer)
		}, failedAttempts},
		{"one candidate never answers", p, func(t *tally) { t.add(answer("pod-a"), nil, namer) }, maxAttempts},
		{"sticky", Probe{Sticky: true, Candidates: p.Candidates}, func(t *tally) { t.add(answer("pod-b"), nil, namer) }, stickyAttempts},
		{"answers and failures", p, func(t *tally) {
			if t.attempts == 1 {
				t.add(netns.Answer{}, netns.ErrRefused, namer)
				return
			}
			t.add(answer([]string{"pod-a", "pod-b"}[t.attempts%2]), nil, namer)
		}, maxAttempts},
	}
	for _, c := range cases {
		tl := newTally()
		for !tl.done(c.probe) {
			c.feed(tl)
		}
		if tl.attempts != c.want {
			t.Errorf("%s: done after %d attempts, want %d", c.name, tl.attempts, c.want)
		}
	}
}

// TestJudge classifies fabricated runs: agreement, noise (kube-proxy
// against itself), a difference, and the deliberate health-check one,
// which holds only when each proxy answered exactly its documented count.
func TestJudge(t *testing.T) {
	sc := healthScenario()
	probes := []Probe{
		{ID: "same", Proto: "TCP"}, {ID: "noisy", Proto: "TCP"}, {ID: "differs", Proto: "TCP"},
		{ID: "health", Service: "web health", Proto: "HTTP"},
		{ID: "health, another count", Service: "web health", Proto: "HTTP"},
	}
	pods := func(p ...string) Outcome { return Outcome{Pods: p, Sources: []string{"node"}} }
	runs := map[string]map[string]Outcome{
		runKubeProxy: {"same": pods("pod-a"), "noisy": pods("pod-a"), "differs": pods("pod-a"),
			"health": {Health: "200 localEndpoints=1"}, "health, another count": {Health: "200 localEndpoints=2"}},
		runAgain: {"same": pods("pod-a"), "noisy": pods("pod-b"), "differs": pods("pod-a"),
			"health": {Health: "200 localEndpoints=1"}, "health, another count": {Health: "200 localEndpoints=2"}},
		runWeir: {"same": pods("pod-a"), "noisy": pods("pod-c"), "differs": {Fails: []string{"refused"}},
			"health": {Health: "503 localEndpoints=0"}, "health, another count": {Health: "503 localEndpoints=0"}},
	}
	r := judge(sc, "nftables", probes, runs)
	ids := func(ds []Disagreement) string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Probe.ID)
		}
		return strings.Join(out, ",")
	}
	if got := ids(r.Noise); got != "noisy" {
		t.Errorf("noise: %q, want noisy", got)
	}
	if got := ids(r.Diffs); got != "differs,health, another count" {
		t.Errorf("diffs: %q, want differs and the health check with another count", got)
	}
	if got := ids(r.Deliberate); got != "health" {
		t.Errorf("deliberate: %q, want health", got)
	}
	if r.Agrees() {
		t.Error("Agrees with noise and differences")
	}
	if rep := r.Report(); !strings.Contains(rep, "kind: Service") || !strings.Contains(rep, "name: web") {
		t.Errorf("the report does not print the objects:\n%s", rep)
	}
}

// healthScenario is a LoadBalancer service with a health check whose
// only port is unnamed, and a slice whose only port is named: kube-proxy
// counts its local ready endpoint, Weir does not.
func healthScenario() *Scenario {
	local, ready, name, port, tcp := NodeName, true, "http", int32(8080), corev1.ProtocolTCP
	return &Scenario{
		Seed: 1,
		Node: &corev1.Node{},
		Services: []*corev1.Service{{
			ObjectMeta: objectMeta("web", nil),
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, HealthCheckNodePort: 30100,
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}},
		Slices: []*discoveryv1.EndpointSlice{{
			ObjectMeta: objectMeta("web-1", map[string]string{discoveryv1.LabelServiceName: "web"}),
			Ports:      []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.11"}, NodeName: &local,
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}},
	}
}

func objectMeta(name string, labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}
}

// TestGenerateDuplicatesAreDecided checks that an address listed by
// several slices of a service never leaves kube-proxy a choice it makes by
// map order: its copies are identical, or exactly one differing copy is
// not terminating.
func TestGenerateDuplicatesAreDecided(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		sc := Generate(seed)
		for _, svc := range sc.Services {
			byAddr := map[string][]discoveryv1.Endpoint{}
			for _, sl := range sc.slicesOf(svc.Name) {
				for _, ep := range sl.Endpoints {
					byAddr[ep.Addresses[0]] = append(byAddr[ep.Addresses[0]], ep)
				}
			}
			for addr, eps := range byAddr {
				if !decided(eps) {
					t.Errorf("seed %d, %s: the copies of %s leave kube-proxy a choice: %+v", seed, svc.Name, addr, eps)
				}
			}
		}
	}
}

// decided reports whether the copies of one address all agree within
// their kind: the terminating ones among themselves and the others among
// themselves, unless exactly one is not terminating.
func decided(eps []discoveryv1.Endpoint) bool {
	var term, live []discoveryv1.Endpoint
	for _, ep := range eps {
		if isTerminating(ep) {
			term = append(term, ep)
		} else {
			live = append(live, ep)
		}
	}
	same := func(list []discoveryv1.Endpoint) bool {
		for _, ep := range list {
			if !reflect.DeepEqual(ep, list[0]) {
				return false
			}
		}
		return true
	}
	return same(live) && (len(live) > 0 || same(term))
}

// TestStickyOutcome checks how a sticky probe's outcome leaves chance
// out: the pod it stuck to is not named, and from a pod that is itself an
// endpoint, sticking to another pod and sticking to itself unanswered
// read the same.
func TestStickyOutcome(t *testing.T) {
	namer := func(a netip.Addr) string { return "node" }
	run := func(p Probe, pod string, err error) string {
		tl := newTally()
		for range stickyAttempts {
			tl.add(netns.Answer{Pod: pod, Source: netip.MustParseAddrPort("172.30.0.1:1")}, err, namer)
		}
		return tl.outcome(p).String()
	}
	client := Probe{From: "client", Sticky: true, Candidates: []string{"pod-a", "pod-b"}}
	self := Probe{From: "pod-a", Sticky: true, Candidates: []string{"pod-a", "pod-b"}}
	if a, b := run(client, "pod-a", nil), run(client, "pod-b", nil); a != b || !strings.Contains(a, "(one pod)") {
		t.Errorf("from the client: %q and %q, want both one pod", a, b)
	}
	if a, b := run(self, "pod-b", nil), run(self, "", netns.ErrTimeout); a != b {
		t.Errorf("from an endpoint: another pod %q, itself unanswered %q, want the same", a, b)
	}
	if a, b := run(self, "pod-b", nil), run(self, "", netns.ErrRefused); a == b {
		t.Errorf("from an endpoint: refused reads as %q, like an answer", b)
	}
	if a, b := run(client, "pod-b", nil), run(client, "", netns.ErrTimeout); a == b {
		t.Errorf("from the client: a timeout reads as %q, like an answer", b)
	}
}
