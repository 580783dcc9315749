package plan

import (
	"net/netip"
	"testing"
)

func sample() *Plan {
	web := &Service{
		Key:        Key{Namespace: "default", Name: "web", Port: "http", Protocol: TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:       80,
		NodePort:   30080,
		Endpoints: []Endpoint{
			{Address: netip.MustParseAddr("10.244.0.11"), Port: 8080, NodeName: "n1", Zone: "z1", Ready: true, Serving: true, Local: true, Weight: 1},
			{Address: netip.MustParseAddr("10.244.0.12"), Port: 8080, NodeName: "n2", Serving: true, Terminating: true, Weight: 3},
		},
	}
	dns := &Service{
		Key:        Key{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: UDP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		Port:       53,
	}
	return &Plan{
		Node:     Node{Name: "n1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("172.30.0.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
		Services: map[Key]*Service{web.Key: web, dns.Key: dns},
	}
}

func TestString(t *testing.T) {
	want := `node n1 zone=z1 address=172.30.0.1 podCIDR=10.244.0.0/24
service default/web:http/TCP
  clusterIP 10.96.0.10 port 80
  nodePort 30080
  endpoint 10.244.0.11:8080 weight=1 node=n1 zone=z1 ready serving local
  endpoint 10.244.0.12:8080 weight=3 node=n2 serving terminating
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
	if n := keys[1].ServiceName(); n != "kube-system/dns" {
		t.Errorf("ServiceName() = %q", n)
	}
	if w := sample().Services[keys[0]].TotalWeight(); w != 4 {
		t.Errorf("TotalWeight() = %d, want 4", w)
	}
}
