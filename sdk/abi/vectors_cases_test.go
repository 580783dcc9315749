package abi

import (
	"net/netip"
	"strconv"

	"github.com/weirproxy/weir/sdk/plan"
)

// The shared test vectors' content: the batches Weir writes and the edits
// plugins make to them. Changing anything here changes the vectors; run
// go test ./abi/ -run TestVectors -update and review the diff.

// batchCase is one input vector: a batch as the host encodes it.
type batchCase struct {
	name     string
	comment  string
	node     plan.Node
	services []*plan.Service
	full     bool
	// signals, when not nil, make the batch a version 2 one carrying them.
	signals [][]Signals
}

// outputCase is one output vector: edits a plugin makes to an input batch.
type outputCase struct {
	name    string
	comment string
	input   string
	edits   []vecEdit
}

// vecEdit is one plugin decision, as the vectors' JSON spells it.
type vecEdit struct {
	Service int      `json:"service"`
	Op      string   `json:"op"`
	Args    []uint32 `json:"args"`
}

// The edit operations of the output vectors (README.md describes them).
const (
	opSetWeight        = "setWeight"
	opSwap             = "swap"
	opKeep             = "keep"
	opSortByWeightDesc = "sortByWeightDesc"
	opSetAffinity      = "setAffinity"
	opSetScheduler     = "setScheduler"
)

func edit(service int, op string, args ...uint32) vecEdit {
	if args == nil {
		args = []uint32{}
	}
	return vecEdit{Service: service, Op: op, Args: args}
}

// vecEp returns a ready, serving endpoint for cluster traffic with weight 1.
func vecEp(addr string, port uint16, node, zone, pod string) plan.Endpoint {
	return plan.Endpoint{
		Address: netip.MustParseAddr(addr), Port: port, NodeName: node, Zone: zone, Pod: pod,
		Ready: true, Serving: true, ForCluster: true, Weight: 1,
	}
}

// vecLocal returns e flagged local and for local traffic.
func vecLocal(e plan.Endpoint) plan.Endpoint {
	e.Local, e.ForLocal = true, true
	return e
}

func vecAddrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func vecPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var vecNode = plan.Node{Name: "node-a", Zone: "zone-1"}

func batchCases() []batchCase {
	return []batchCase{
		{"empty", "no services, a node without a zone, not full", plan.Node{Name: "node-a"}, nil, false, nil},
		{"simple", "one IPv4 service with two endpoints, one of them local; the example of docs/plugin-abi.md", vecNode, []*plan.Service{vecSimple()}, true, nil},
		{"every-field", "a dual-stack service using every field, then a minimal one", vecNode, []*plan.Service{vecEveryField(), vecMinimal()}, false, nil},
		{"ipv6", "IPv6-only UDP service with IPv6 endpoints and source ranges", vecNode, []*plan.Service{vecIPv6()}, true, nil},
		{"many-endpoints", "300 endpoints in one service, then a service without endpoints", vecNode, []*plan.Service{vecMany(300), vecNoEndpoints()}, true, nil},
		{"unicode", "non-ASCII strings everywhere, an empty port name, JSON-escaped characters", plan.Node{Name: "nœud-α", Zone: "区域-1"}, []*plan.Service{vecUnicode()}, true, nil},
		{"max", "every number at its maximum, then every number at zero", vecNode, []*plan.Service{vecMax(), vecZero()}, false, nil},
		{"signals", "version 2: the simple service and a three-endpoint one, with each endpoint's active and new connections; the example of docs/plugin-abi.md",
			vecNode, []*plan.Service{vecSimple(), vecLeastConn()}, true,
			[][]Signals{{{Active: 3, New: 1}, {Active: 0, New: 0}}, {{Active: 12, New: 4}, {Active: 1, New: 1}, {Active: 0xffffffff, New: 0xffffffff}}}},
		{"signals-ipv6", "version 2: the IPv6 service and a service without endpoints; the signals of the third endpoint are missing, so zero",
			vecNode, []*plan.Service{vecIPv6(), vecNoEndpoints()}, false, [][]Signals{{{Active: 5, New: 2}, {Active: 7, New: 0}}}},
	}
}

func outputCases() []outputCase {
	return []outputCase{
		{"unchanged", "no edits: the output is the input", "simple", nil},
		{"simple-reweight", "weight the local endpoint up", "simple", []vecEdit{edit(0, opSetWeight, 0, 10)}},
		{"every-field-drop", "drop endpoints ids 0 and 2: the kept records move to the front, the slots after the new count keep their old bytes", "every-field",
			[]vecEdit{edit(0, opKeep, 1, 3)}},
		{"every-field-reorder", "swap the first and last endpoints", "every-field", []vecEdit{edit(0, opSwap, 0, 3)}},
		{"every-field-affinity-scheduler", "change affinity and scheduler of both services", "every-field", []vecEdit{
			edit(0, opSetAffinity, 60), edit(0, opSetScheduler, 5), edit(1, opSetAffinity, 10800), edit(1, opSetScheduler, 2)}},
		{"every-field-clear", "clear affinity and scheduler", "every-field", []vecEdit{edit(0, opSetAffinity, 0), edit(0, opSetScheduler, 0)}},
		{"ipv6-combined", "reweight, swap, then drop", "ipv6", []vecEdit{
			edit(0, opSetWeight, 1, 0), edit(0, opSwap, 0, 2), edit(0, opKeep, 0, 2)}},
		{"many-endpoints-sort", "stable sort by weight, heaviest first, then reweight the first slot", "many-endpoints", []vecEdit{
			edit(0, opSortByWeightDesc), edit(0, opSetWeight, 0, 1)}},
		{"many-endpoints-drop-all", "drop every endpoint of the first service", "many-endpoints", []vecEdit{edit(0, opKeep)}},
		{"unicode-reweight", "drain one endpoint of the unicode service", "unicode", []vecEdit{edit(0, opSetWeight, 1, 0)}},
		{"signals-least-conn", "weights inverse to the active connections, then the busiest endpoint dropped", "signals", []vecEdit{
			edit(1, opSetWeight, 0, 1), edit(1, opSetWeight, 1, 50), edit(1, opSetWeight, 2, 0), edit(1, opKeep, 0, 1)}},
		{"signals-ipv6-sort", "the signals travel with their endpoints: a swap and a sort", "signals-ipv6", []vecEdit{
			edit(0, opSwap, 0, 2), edit(0, opSortByWeightDesc)}},
		{"max-clamp", "an affinity above 86400 is clamped; a maximal weight drained; a zero weight raised to the maximum", "max", []vecEdit{
			edit(1, opSetAffinity, 0xffffffff), edit(0, opSetWeight, 0, 0), edit(1, opSetWeight, 0, 0xffffffff)}},
	}
}

func vecSimple() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP},
		ClusterIPs: vecAddrs("10.96.0.10"),
		Port:       80,
		Endpoints: []plan.Endpoint{
			vecLocal(vecEp("10.244.1.5", 8080, "node-a", "zone-1", "web-1")),
			vecEp("10.244.2.7", 8080, "node-b", "zone-2", "web-2"),
		},
	}
}

// vecLeastConn is a service of three endpoints on three nodes for the signal vectors.
func vecLeastConn() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "default", Name: "api", Port: "grpc", Protocol: plan.TCP},
		ClusterIPs: vecAddrs("10.96.0.11"),
		Port:       9090,
		Endpoints: []plan.Endpoint{
			vecEp("10.244.1.8", 9090, "node-a", "zone-1", "api-1"),
			vecEp("10.244.2.8", 9090, "node-b", "zone-2", "api-2"),
			vecEp("10.244.3.8", 9090, "node-c", "zone-1", "api-3"),
		},
	}
}

func vecEveryField() *plan.Service {
	return &plan.Service{
		Key:                 plan.Key{Namespace: "prod", Name: "shop", Port: "https", Protocol: plan.TCP},
		ClusterIPs:          vecAddrs("10.96.0.20", "fd00::20"),
		Port:                443,
		NodePort:            30443,
		ExternalIPs:         vecAddrs("192.0.2.7", "2001:db8::7"),
		LoadBalancerIPs:     vecAddrs("198.51.100.9", "2001:db8:1::9"),
		SourceRanges:        vecPrefixes("203.0.113.0/24", "2001:db8:2::/48", "0.0.0.0/0", "::/0"),
		ExternalLocal:       true,
		InternalLocal:       true,
		HealthCheckNodePort: 31000,
		Affinity:            &plan.Affinity{TimeoutSeconds: 10800},
		Scheduler:           plan.SchedulerMaglevHash,
		Labels:              map[string]string{"app": "shop", "tier": "front", "": "empty-key", "z": ""},
		Annotations:         map[string]string{"weir.dev/note": "zone", "b": "2", "a": "1"},
		Endpoints: []plan.Endpoint{
			vecLocal(vecEp("10.1.0.1", 8443, "node-a", "zone-1", "shop-1")),
			{Address: netip.MustParseAddr("fd00:1::1"), Port: 8443, NodeName: "node-b", Zone: "zone-2", Pod: "shop-2",
				Ready: true, Serving: true, ForCluster: true, Weight: 7},
			{Address: netip.MustParseAddr("10.1.0.3"), Port: 8443, NodeName: "node-c", Zone: "zone-2", Pod: "shop-3",
				Serving: true, Terminating: true, Weight: 0},
			{Address: netip.MustParseAddr("10.1.0.4"), Port: 8443, NodeName: "node-a",
				Ready: true, Serving: true, Terminating: true, Local: true, ForCluster: true, ForLocal: true, Weight: 3},
		},
	}
}

func vecMinimal() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "default", Name: "kubernetes", Port: "https", Protocol: plan.TCP},
		ClusterIPs: vecAddrs("10.96.0.1"),
		Port:       443,
		Endpoints:  []plan.Endpoint{vecEp("192.168.0.10", 6443, "", "", "")},
	}
}

func vecIPv6() *plan.Service {
	return &plan.Service{
		Key:             plan.Key{Namespace: "kube-system", Name: "dns6", Port: "dns", Protocol: plan.UDP},
		ClusterIPs:      vecAddrs("fd00:10::a"),
		Port:            53,
		NodePort:        30053,
		LoadBalancerIPs: vecAddrs("2001:db8:ffff::53"),
		SourceRanges:    vecPrefixes("2001:db8::/32", "fe80::/10", "::1/128"),
		Endpoints: []plan.Endpoint{
			vecLocal(vecEp("2001:db8:0:1::5", 5353, "node-a", "zone-1", "dns-1")),
			vecEp("2001:db8:0:2::7", 5353, "node-b", "zone-1", "dns-2"),
			vecEp("fd00:244:0:3:0:0:0:1", 5353, "node-c", "zone-2", "dns-3"),
		},
	}
}

// vecMany returns a service with n endpoints over 5 nodes and 3 zones,
// every seventh IPv6, with weights 0 to 6.
func vecMany(n int) *plan.Service {
	s := &plan.Service{
		Key:        plan.Key{Namespace: "load", Name: "big", Port: "http", Protocol: plan.TCP},
		ClusterIPs: vecAddrs("10.96.1.1"),
		Port:       8080,
		Labels:     map[string]string{"app": "big"},
		Endpoints:  make([]plan.Endpoint, n),
	}
	for i := range s.Endpoints {
		addr := "10.2." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
		if i%7 == 6 {
			addr = "fd00:2::" + strconv.FormatInt(int64(i), 16)
		}
		e := vecEp(addr, uint16(9000+i%3), "node-"+string(rune('a'+i%5)), "zone-"+strconv.Itoa(1+i%3), "big-"+strconv.Itoa(i))
		e.Weight = uint32(i % 7)
		if i%5 == 0 {
			e = vecLocal(e)
		}
		s.Endpoints[i] = e
	}
	return s
}

func vecNoEndpoints() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "load", Name: "idle", Port: "http", Protocol: plan.TCP},
		ClusterIPs: vecAddrs("10.96.1.2"),
		Port:       80,
	}
}

func vecUnicode() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "café", Name: "サービス", Port: "", Protocol: plan.SCTP},
		ClusterIPs: vecAddrs("10.96.2.2"),
		Port:       3868,
		Labels:     map[string]string{"app.kubernetes.io/名前": "ウェブ", "emoji": "🚀✨", "Ünïcödé": "ok"},
		Annotations: map[string]string{
			"note":     "naïve — “quoted” \"json\" \\ back\\slash\nnew line\ttab\u0001",
			"ελληνικά": "αβγ",
		},
		Endpoints: []plan.Endpoint{
			vecLocal(vecEp("10.3.0.1", 3868, "nœud-α", "区域-1", "pod-ñ-😀")),
			vecEp("10.3.0.2", 3868, "nœud-β", "区域-2", "pod-ß-€"),
		},
	}
}

func vecMax() *plan.Service {
	return &plan.Service{
		Key:                 plan.Key{Namespace: "max", Name: "max", Port: "max", Protocol: plan.SCTP},
		ClusterIPs:          vecAddrs("255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
		Port:                65535,
		NodePort:            65535,
		HealthCheckNodePort: 65535,
		SourceRanges:        vecPrefixes("255.255.255.255/32", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
		ExternalLocal:       true,
		InternalLocal:       true,
		Affinity:            &plan.Affinity{TimeoutSeconds: plan.MaxAffinitySeconds},
		Scheduler:           plan.SchedulerMaglevHash,
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("255.255.255.254"), Port: 65535, NodeName: "node-a", Zone: "zone-1", Pod: "max-0",
				Ready: true, Serving: true, Terminating: true, Local: true, ForCluster: true, ForLocal: true, Weight: 0xffffffff},
		},
	}
}

func vecZero() *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: "zero", Name: "zero", Protocol: plan.UDP},
		ClusterIPs: vecAddrs("0.0.0.0", "::"),
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("0.0.0.1")},
		},
	}
}
