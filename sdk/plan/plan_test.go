package plan

import (
	"net/netip"
	"testing"
	"unsafe"
)

func sample() *Plan {
	web := &Service{
		Key:        Key{Namespace: "default", Name: "web", Port: "http", Protocol: TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:       80,
		NodePort:   30080,
		Endpoints: []Endpoint{
			{Address: netip.MustParseAddr("10.244.0.11"), Port: 8080, NodeName: "n1", Zone: "z1", Ready: true, Serving: true, Local: true, ForCluster: true, ForLocal: true, Weight: 1},
			{Address: netip.MustParseAddr("10.244.0.12"), Port: 8080, NodeName: "n2", Serving: true, Terminating: true, Weight: 3},
			{Address: netip.MustParseAddr("10.244.0.13"), Port: 8080, NodeName: "n3", Ready: true, Serving: true, ForCluster: true, Weight: 1},
		},
	}
	dns := &Service{
		Key:        Key{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: UDP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		Port:       53,
	}
	return &Plan{
		Node:         Node{Name: "n1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("172.30.0.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
		Services:     map[Key]*Service{web.Key: web, dns.Key: dns},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	}
}

func TestString(t *testing.T) {
	want := `node n1 zone=z1 address=172.30.0.1 podCIDR=10.244.0.0/24
serviceCIDRs 10.96.0.0/16
service default/web:http/TCP
  clusterIP 10.96.0.10 port 80
  nodePort 30080
  endpoint 10.244.0.11:8080 weight=1 node=n1 zone=z1 ready serving local for-local
  endpoint 10.244.0.12:8080 weight=3 node=n2 serving terminating not-for-cluster
  endpoint 10.244.0.13:8080 weight=1 node=n3 ready serving
service kube-system/dns:dns/UDP
  clusterIP 10.96.0.53 port 53
  no endpoints: reject
`
	for range 5 { // map order must not leak into the text
		if got := sample().String(); got != want {
			t.Fatalf("String() =\n%s\nwant\n%s", got, want)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	p := sample()
	c := p.Clone()
	key := Key{Namespace: "default", Name: "web", Port: "http", Protocol: TCP}
	c.Services[key].Endpoints[0].Weight = 9
	c.Services[key].ClusterIPs[0] = netip.MustParseAddr("10.96.0.99")
	c.Node.Addresses[0] = netip.MustParseAddr("1.1.1.1")
	c.ServiceCIDRs[0] = netip.MustParsePrefix("10.100.0.0/16")
	delete(c.Services, Key{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: UDP})
	if p.String() != sample().String() {
		t.Errorf("changing the clone changed the original:\n%s", p)
	}
	if !p.Services[key].Equal(sample().Services[key]) || p.Services[key].Equal(c.Services[key]) {
		t.Error("Equal does not tell the original and the modified clone apart")
	}
}

func TestKeyOrderAndText(t *testing.T) {
	keys := sample().Keys()
	if len(keys) != 2 || keys[0].Name != "web" || keys[1].Name != "dns" {
		t.Errorf("Keys() = %v, want default/web before kube-system/dns", keys)
	}
	if s := keys[0].String(); s != "default/web:http/TCP" {
		t.Errorf("Key.String() = %q", s)
	}
}

// Clone, Equal and SameRules are checked field by field in coverage_test.go.
func TestExternalFieldsText(t *testing.T) {
	lb := &Service{
		Key:                 Key{Namespace: "default", Name: "lb", Port: "https", Protocol: TCP},
		ClusterIPs:          []netip.Addr{netip.MustParseAddr("10.96.0.40")},
		Port:                443,
		NodePort:            30443,
		ExternalIPs:         []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		LoadBalancerIPs:     []netip.Addr{netip.MustParseAddr("198.51.100.5")},
		SourceRanges:        []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ExternalLocal:       true,
		InternalLocal:       true,
		HealthCheckNodePort: 32000,
		Affinity:            &Affinity{TimeoutSeconds: 60},
	}
	want := `service default/lb:https/TCP
  clusterIP 10.96.0.40 port 443
  nodePort 30443
  externalIP 192.0.2.10
  loadBalancerIP 198.51.100.5
  sourceRange 10.0.0.0/8
  externalTrafficPolicy=Local internalTrafficPolicy=Local healthCheckNodePort=32000 affinity=ClientIP/60s
  no endpoints: reject
`
	if got := lb.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
}

// TestEndpointHasNoPadding keeps plan.Endpoint at 88 bytes on 64-bit
// platforms: a plan holds one per endpoint of every service port (100k
// at 10k services × 10 endpoints), and a field added in the wrong place
// would pad it.
func TestEndpointHasNoPadding(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is checked on 64-bit platforms")
	}
	if n := unsafe.Sizeof(Endpoint{}); n > 88 {
		t.Errorf("plan.Endpoint is %d bytes, want at most 88", n)
	}
}
