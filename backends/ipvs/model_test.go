package ipvs

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

func ep(addr string, port uint16, weight uint32) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true,
		ForCluster: true, Weight: weight}
}

// localEP is an endpoint on this node, serving both traffic policies.
func localEP(addr string, port uint16) plan.Endpoint {
	e := ep(addr, port, 1)
	e.Local, e.ForLocal = true, true
	return e
}

func service(name string, proto plan.Protocol, port, nodePort uint16, ips []string, eps ...plan.Endpoint) *plan.Service {
	s := &plan.Service{Key: plan.Key{Namespace: "default", Name: name, Port: "p", Protocol: proto},
		Port: port, NodePort: nodePort, Endpoints: eps}
	for _, ip := range ips {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(ip))
	}
	return s
}

// describe prints a service state as sorted "key: settings reals" lines.
func describe(st *serviceState) string {
	if st == nil {
		return "<nil>"
	}
	var lines []string
	for _, k := range st.keys() {
		lines = append(lines, k.String()+": "+st.servers[k].String())
	}
	return strings.Join(lines, "\n")
}

var nodeIPs = []netip.Addr{netip.MustParseAddr("172.30.0.1"), netip.MustParseAddr("fd00::1")}

func TestDesiredService(t *testing.T) {
	dual := service("dual", plan.TCP, 80, 30080, []string{"10.96.0.10", "fd00:10:96::10"},
		ep("10.244.0.11", 8080, 1), ep("fd00:10:244::11", 8080, 1))
	etpLocal := service("etp", plan.TCP, 80, 30081, []string{"10.96.0.11"},
		localEP("10.244.0.11", 8080), ep("10.244.1.12", 8080, 1))
	etpLocal.ExternalLocal = true
	etpLocal.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	etpLocal.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	itpLocal := service("itp", plan.UDP, 53, 0, []string{"10.96.0.12"},
		localEP("10.244.0.11", 53), ep("10.244.1.12", 53, 1))
	itpLocal.InternalLocal = true
	sticky := service("sticky", plan.TCP, 443, 0, []string{"10.96.0.13"}, ep("10.244.0.11", 8443, 0), ep("10.244.0.12", 8443, 1))
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	sticky.Scheduler = plan.SchedulerSourceHash
	tests := []struct {
		svc  *plan.Service
		want string
	}{
		{dual, `TCP 10.96.0.10:80: wlc 10.244.0.11:8080 w1
TCP 172.30.0.1:30080: wlc 10.244.0.11:8080 w1
TCP [fd00::1]:30080: wlc [fd00:10:244::11]:8080 w1
TCP [fd00:10:96::10]:80: wlc [fd00:10:244::11]:8080 w1`},
		{etpLocal, `TCP 10.96.0.11:80: wlc 10.244.0.11:8080 w1 10.244.1.12:8080 w1
TCP 172.30.0.1:30081: wlc 10.244.0.11:8080 w1
TCP 192.0.2.10:80: wlc 10.244.0.11:8080 w1
TCP 198.51.100.5:80: wlc 10.244.0.11:8080 w1`},
		{itpLocal, `UDP 10.96.0.12:53: wlc 10.244.0.11:53 w1`},
		{sticky, `TCP 10.96.0.13:443: sh persistent 600s 10.244.0.11:8443 w0 10.244.0.12:8443 w1`},
	}
	for _, tt := range tests {
		t.Run(tt.svc.Key.Name, func(t *testing.T) {
			if got := describe(desiredService(tt.svc, nodeIPs, "wlc", 0)); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestDesiredServiceAddresses(t *testing.T) {
	s := service("web", plan.TCP, 80, 30080, []string{"10.96.0.10"})
	s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("10.96.0.10")}
	s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.5")}
	st := desiredService(s, nodeIPs, "rr", 0)
	want := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("198.51.100.5")}
	if !slices.Equal(st.addrs, want) {
		t.Errorf("interface addresses: got %v, want %v (node addresses never; each once)", st.addrs, want)
	}
}

func TestDesiredServiceNothingToProgram(t *testing.T) {
	if st := desiredService(service("none", plan.TCP, 80, 0, nil), nodeIPs, "rr", 0); st != nil {
		t.Errorf("service without addresses or node port: got %s, want nil", describe(st))
	}
	if st := desiredService(service("odd", "ICMP", 80, 0, []string{"10.96.0.1"}), nodeIPs, "rr", 0); st != nil {
		t.Errorf("unknown protocol: got %s, want nil", describe(st))
	}
}

func TestSchedulerFor(t *testing.T) {
	for _, tt := range []struct {
		hint plan.Scheduler
		want string
	}{
		{"", "wrr"}, {plan.SchedulerSourceHash, "sh"}, {plan.SchedulerMaglevHash, "mh"}, {"bogus", "wrr"},
	} {
		if got := schedulerFor(&plan.Service{Scheduler: tt.hint}, "wrr"); got != tt.want {
			t.Errorf("hint %q: got %q, want %q", tt.hint, got, tt.want)
		}
	}
}

func TestScaleWeights(t *testing.T) {
	for _, tt := range []struct {
		in   []uint32
		want []int32
	}{
		{nil, []int32{}},
		{[]uint32{1, 1, 1}, []int32{1, 1, 1}},
		{[]uint32{100, 300, 0}, []int32{1, 3, 0}},
		{[]uint32{0, 0}, []int32{0, 0}},
		{[]uint32{7, 5}, []int32{7, 5}},
		{[]uint32{1, 1 << 31}, []int32{1, 65535}},
		{[]uint32{1 << 20, 1 << 31, 3}, []int32{32, 65535, 1}},
		{[]uint32{^uint32(0), ^uint32(0) - 1}, []int32{65535, 65535}},
	} {
		if got := scaleWeights(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("scaleWeights(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestOptionsDefaultsAndValidation(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil || o.Scheduler != "rr" || o.Interface != "weir-ipvs0" || o.GracePeriod != DefaultGracePeriod {
		t.Errorf("defaults: got %+v, %v", o, err)
	}
	for _, s := range Schedulers {
		if _, err := (Options{Scheduler: s}).withDefaults(); err != nil {
			t.Errorf("scheduler %s: %v", s, err)
		}
	}
	for _, bad := range []Options{{Scheduler: "fifo"}, {Interface: "a-very-long-interface-name"}, {GracePeriod: -1}} {
		_, err := bad.withDefaults()
		if err == nil {
			t.Errorf("%+v: want an error", bad)
			continue
		}
		field := map[bool]string{true: "Options.Scheduler"}[bad.Scheduler != ""]
		if field != "" && !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: error %q does not name %s", bad, err, field)
		}
	}
}

func TestVirtualServerKeysSorted(t *testing.T) {
	st := desiredService(service("web", plan.TCP, 80, 30080, []string{"10.96.0.10", "fd00:10:96::10"}), nodeIPs, "rr", 0)
	keys := st.keys()
	if !slices.IsSortedFunc(keys, vsKey.compare) || len(keys) != len(slices.Collect(maps.Keys(st.servers))) {
		t.Errorf("keys %v not sorted or incomplete", keys)
	}
}

func TestNodePortAddrs(t *testing.T) {
	local := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("172.30.0.1"), netip.MustParseAddr("fd00::1")}
	node := plan.Node{Addresses: []netip.Addr{netip.MustParseAddr("172.30.0.1"), netip.MustParseAddr("192.0.2.99")}}
	for _, tt := range []struct {
		name string
		opts backends.Common
		want []netip.Addr
	}{
		{"all local", backends.Common{}, local},
		{"cidrs", backends.Common{NodePortCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, NodePortPrimary: true}, local[:1]},
		{"primary: the node's local addresses", backends.Common{NodePortPrimary: true}, local[1:2]},
	} {
		if got := nodePortAddrs(&tt.opts, node, local); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}
