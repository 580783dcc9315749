package diagnose

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

var webKey = plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP}

func webService(mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

// webSlice is a slice of web with the port named port and one endpoint
// per condition given (r ready, s serving, t terminating; none: one ready
// endpoint).
func webSlice(port string, conditions ...string) *discoveryv1.EndpointSlice {
	n := int32(8080)
	if len(conditions) == 0 {
		conditions = []string{"rs"}
	}
	var eps []discoveryv1.Endpoint
	for i, c := range conditions {
		r, s, t := strings.Contains(c, "r"), strings.Contains(c, "s"), strings.Contains(c, "t")
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{"10.244.0." + string(rune('1'+i))},
			Conditions: discoveryv1.EndpointConditions{Ready: &r, Serving: &s, Terminating: &t}})
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		Endpoints:  eps,
		Ports:      []discoveryv1.EndpointPort{{Name: &port, Port: &n}},
	}
}

// ep is an endpoint with conditions spelt as flags: r ready, s serving,
// t terminating, l local, c for cluster, o for Local policies.
func ep(addr, flags string) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: 8080, Weight: 1, NodeName: "node-a",
		Ready: strings.Contains(flags, "r"), Serving: strings.Contains(flags, "s"), Terminating: strings.Contains(flags, "t"),
		Local: strings.Contains(flags, "l"), ForCluster: strings.Contains(flags, "c"), ForLocal: strings.Contains(flags, "o")}
}

func planned(mutate func(*plan.Service), eps ...plan.Endpoint) map[plan.Key]*plan.Service {
	s := &plan.Service{Key: webKey, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 80, Endpoints: eps}
	if mutate != nil {
		mutate(s)
	}
	return map[plan.Key]*plan.Service{webKey: s}
}

func TestServiceFindings(t *testing.T) {
	healthy := planned(nil, ep("10.244.0.11", "rsclo"), ep("10.244.0.12", "rsc"))
	tests := []struct {
		name   string
		in     ServiceInput
		want   []string // codes, in order, with severity
		broken bool
	}{
		{"healthy", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")}, Planned: healthy, Final: healthy,
			Kernel: map[plan.Key][]string{}}, []string{"info endpoints.counts", "info kernel.in-sync"}, false},
		{"not found", ServiceInput{}, []string{"broken service.not-found"}, true},
		{"external name", ServiceInput{Service: webService(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })},
			[]string{"info service.external-name"}, false},
		{"headless", ServiceInput{Service: webService(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone })},
			[]string{"info service.headless"}, false},
		{"another proxy", ServiceInput{Service: webService(func(s *corev1.Service) {
			s.Labels = map[string]string{labelServiceProxyName: "other"}
		})}, []string{"info service.other-proxy"}, false},
		{"selector without slices", ServiceInput{Service: webService(), Planned: planned(nil), Final: planned(nil)},
			[]string{"broken service.no-slices", "broken endpoints.none"}, true},
		{"named port unresolved", ServiceInput{Service: webService(func(s *corev1.Service) {
			s.Spec.Ports[0].TargetPort = intstr.FromString("web-http")
		}), Slices: []*discoveryv1.EndpointSlice{webSlice("other")}, Planned: planned(nil), Final: planned(nil)},
			[]string{"broken port.named-target-unresolved", "broken endpoints.none"}, true},
		{"none serving", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http", "")},
			Planned: planned(nil), Final: planned(nil)},
			[]string{"info endpoints.counts", "broken endpoints.none-serving"}, true},
		{"terminating fallback", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http", "st")},
			Planned: planned(nil, ep("10.244.0.11", "stc")), Final: planned(nil, ep("10.244.0.11", "stc"))},
			[]string{"info endpoints.counts", "warning endpoints.terminating-fallback"}, false},
		{"external local without local endpoints", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")},
			Planned: planned(func(s *plan.Service) { s.NodePort, s.ExternalLocal, s.HealthCheckNodePort = 30080, true, 31000 }, ep("10.244.0.12", "rsc")),
			Final:   planned(func(s *plan.Service) { s.NodePort, s.ExternalLocal, s.HealthCheckNodePort = 30080, true, 31000 }, ep("10.244.0.12", "rsc"))},
			[]string{"info endpoints.counts", "broken policy.external-local-no-endpoints"}, true},
		{"plugin dropped everything", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")},
			Planned: healthy, Final: planned(nil),
			Changes: []PluginChange{{Plugin: "drain", Before: healthy[webKey], After: planned(nil)[webKey]}}},
			[]string{"info endpoints.counts", "info plugins.changed", "broken plugins.dropped-all"}, true},
		{"kernel differs", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")}, Planned: healthy, Final: healthy,
			Kernel: map[plan.Key][]string{webKey: {"cluster IP 10.96.0.10:80/TCP: endpoints: want a, got b"}}},
			[]string{"info endpoints.counts", "broken kernel.differs"}, true},
		{"kept by a closed plugin", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")}, Planned: healthy},
			[]string{"info endpoints.counts", "warning plugins.kept"}, false},
		{"unknown port", ServiceInput{Service: webService(), Port: "grpc", Slices: []*discoveryv1.EndpointSlice{webSlice("http")}, Planned: healthy, Final: healthy},
			[]string{"broken service.port-not-found"}, true},
		{"port by number", ServiceInput{Service: webService(), Port: "80", Slices: []*discoveryv1.EndpointSlice{webSlice("http")}, Planned: healthy, Final: healthy},
			[]string{"info endpoints.counts"}, false},
		{"bad input", ServiceInput{Service: webService(), Slices: []*discoveryv1.EndpointSlice{webSlice("http")},
			Problems: []string{"Service default/web: spec.clusterIPs[0]: not an IP"}},
			[]string{"broken service.bad-input", "broken port.not-planned"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Name, tt.in.Node = "default/web", "node-a"
			got := Service(tt.in)
			var codes []string
			for _, f := range got {
				if f.Code == "service.summary" {
					continue // every proxied Service has one: TestServiceSummary
				}
				codes = append(codes, f.Severity.String()+" "+f.Code)
				if f.Message == "" || f.Subject == "" {
					t.Errorf("finding %s has no message or subject", f.Code)
				}
			}
			if !slices.Equal(codes, tt.want) {
				t.Errorf("findings %q, want %q", codes, tt.want)
			}
			r := Report{Findings: got}
			if r.Broken() != tt.broken {
				t.Errorf("Broken() = %v, want %v", r.Broken(), tt.broken)
			}
		})
	}
}

func TestPluginChangeIsDescribed(t *testing.T) {
	before := planned(nil, ep("10.244.0.11", "rsc"), ep("10.244.0.12", "rsc"))[webKey]
	after := before.Clone()
	after.Endpoints = after.Endpoints[:1]
	after.Endpoints[0].Weight = 3
	after.Affinity = &plan.Affinity{TimeoutSeconds: 60}
	got := describeChange(before, after)
	want := "dropped 10.244.0.12:8080; set weights 10.244.0.11:8080 1→3; changed affinity from none to ClientIP 60 s"
	if got != want {
		t.Errorf("describeChange = %q, want %q", got, want)
	}
}

func TestReportOutput(t *testing.T) {
	r := Report{Mode: "nftables", From: "source", Findings: []Finding{
		{Code: "endpoints.none", Severity: Broken, Subject: "default/web:http/TCP", Message: "no endpoints"},
	}}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "broken  default/web:http/TCP: no endpoints [endpoints.none]") ||
		!strings.Contains(text.String(), "nftables: traffic is lost or the kernel differs from the plan (1 broken)") {
		t.Errorf("text report:\n%s", text.String())
	}
	var js strings.Builder
	if err := (&Report{Mode: "ipvs"}).WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"findings": []`) {
		t.Errorf("empty JSON report has no empty findings list:\n%s", js.String())
	}
	var back Report
	var buf strings.Builder
	_ = r.WriteJSON(&buf)
	if err := json.Unmarshal([]byte(buf.String()), &back); err != nil || back.Findings[0].Severity != Broken {
		t.Errorf("JSON round trip: %v, %+v", err, back)
	}
}

func TestFlowFindings(t *testing.T) {
	a, b := netip.MustParseAddr("10.244.0.11"), netip.MustParseAddr("10.244.0.12")
	counts := []conntrack.FlowCount{{Protocol: plan.UDP, ByEndpoint: map[netip.Addr]int{a: 2}, Stale: 1, StaleFrom: []netip.Addr{b}}}
	got := flowFindings("default/dns:dns/UDP", plan.UDP, counts)
	if len(got) != 2 || got[0].Code != "conntrack.flows" || !strings.Contains(got[0].Message, "3 tracked flows to its addresses: 10.244.0.11 2") ||
		got[1].Code != "conntrack.stale" || got[1].Severity != Broken || !strings.Contains(got[1].Message, "1 UDP flow still goes to 10.244.0.12") {
		t.Errorf("UDP with a stale flow: %+v", got)
	}
	got = flowFindings("default/web:http/TCP", plan.TCP, counts)
	if len(got) != 2 || got[1].Code != "conntrack.old-connections" || got[1].Severity != Info {
		t.Errorf("TCP with an old connection: %+v", got)
	}
	counts[0].Stale, counts[0].StaleFrom = 0, nil
	if got = flowFindings("default/dns:dns/UDP", plan.UDP, counts); len(got) != 1 || got[0].Severity != Info {
		t.Errorf("no stale flows: %+v", got)
	}
	if got = flowFindings("default/dns:dns/UDP", plan.UDP, nil); got != nil {
		t.Errorf("table not read: %+v", got)
	}
}

func TestTopologyFindings(t *testing.T) {
	hinted := func(zones ...string) *discoveryv1.EndpointSlice {
		s := webSlice("http", "rs", "rs")
		for i, z := range zones {
			node := "node-" + z
			s.Endpoints[i].NodeName, s.Endpoints[i].Zone = &node, &zones[i]
			if z != "" {
				s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}}
			}
		}
		return s
	}
	inForce := planned(nil, ep("10.244.0.1", "rsc"), ep("10.244.0.2", "rs"))
	everyone := planned(nil, ep("10.244.0.1", "rsc"), ep("10.244.0.2", "rsc"))
	tests := []struct {
		name    string
		slice   *discoveryv1.EndpointSlice
		zone    string
		planned map[plan.Key]*plan.Service
		want    string // a message fragment
	}{
		{"in force", hinted("a", "b"), "a", inForce, "goes to 1 of the 2 ready endpoints"},
		{"an endpoint without hints", hinted("a", ""), "a", everyone, "only 1 of the 2 ready endpoints carry hints"},
		{"no zone", hinted("a", "b"), "", everyone, "this node has no zone"},
		{"no hint for this zone", hinted("a", "b"), "c", everyone, "no hint names this node or its zone c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Service(ServiceInput{Name: "default/web", Node: "node-a", Zone: tt.zone, Service: webService(),
				Slices: []*discoveryv1.EndpointSlice{tt.slice}, Planned: tt.planned, Final: tt.planned})
			var msgs []string
			for _, f := range got {
				msgs = append(msgs, f.Code+": "+f.Message)
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tt.want) {
				t.Errorf("no %q in:\n%s", tt.want, strings.Join(msgs, "\n"))
			}
			if !strings.Contains(strings.Join(msgs, "\n"), "by node: node-") {
				t.Errorf("no per-node counts in:\n%s", strings.Join(msgs, "\n"))
			}
		})
	}
}

func TestServiceSummary(t *testing.T) {
	svc := webService(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.Ports[0].TargetPort = intstr.FromString("web-http")
	})
	got := Service(ServiceInput{Name: "default/web", Service: svc})
	want := "type NodePort, cluster IP 10.96.0.10, ports http (80/TCP) → web-http (node port 30080), selector app=web"
	if len(got) == 0 || got[0].Code != "service.summary" || got[0].Message != want {
		t.Errorf("first finding %+v, want service.summary %q", got, want)
	}
}
