package source

import (
	"reflect"
	"strconv"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Objects with every field a real API server or a manifest may set, and
// what a Trimmer must leave of them.

var (
	created = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	deleted = metav1.NewTime(time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC))
)

// fullMeta is metadata with every field set.
func fullMeta(labels, annotations map[string]string) metav1.ObjectMeta {
	grace := int64(30)
	yes := true
	return metav1.ObjectMeta{
		Name: "web", GenerateName: "web-", Namespace: "shop", UID: "0e3c5f2a",
		ResourceVersion: "42", Generation: 7, CreationTimestamp: created, DeletionTimestamp: &deleted,
		DeletionGracePeriodSeconds: &grace, Labels: labels, Annotations: annotations,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "1", Controller: &yes}},
		Finalizers:      []string{"example.com/f"},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
	}
}

func ptr[T any](v T) *T { return &v }

func fullService() *corev1.Service {
	local := corev1.ServiceInternalTrafficPolicyLocal
	vip, proxy := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: fullMeta(map[string]string{"app": "web", "weir.dev/canary": "10"},
			map[string]string{"weir.dev/weight": "3", lastApplied: `{"a huge":"copy"}`}),
		Spec: corev1.ServiceSpec{
			Type:        corev1.ServiceTypeLoadBalancer,
			ClusterIP:   "10.96.0.10",
			ClusterIPs:  []string{"10.96.0.10", "fd00::10"},
			Selector:    map[string]string{"app": "web"},
			IPFamilies:  []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			ExternalIPs: []string{"192.0.2.1"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http"), Port: 80, TargetPort: intstr.FromString("http"), NodePort: 30080},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353), NodePort: 30053},
			},
			IPFamilyPolicy:                ptr(corev1.IPFamilyPolicyPreferDualStack),
			LoadBalancerIP:                "203.0.113.9",
			LoadBalancerSourceRanges:      []string{"10.0.0.0/8"},
			LoadBalancerClass:             ptr("example.com/lb"),
			AllocateLoadBalancerNodePorts: ptr(true),
			ExternalName:                  "ignored.example.com",
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy:         &local,
			HealthCheckNodePort:           31000,
			PublishNotReadyAddresses:      true,
			SessionAffinity:               corev1.ServiceAffinityClientIP,
			SessionAffinityConfig:         &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}},
			TrafficDistribution:           ptr("PreferClose"),
		},
		Status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
				{IP: "203.0.113.1", IPMode: &vip, Hostname: "lb.example.com", Ports: []corev1.PortStatus{{Port: 80, Protocol: corev1.ProtocolTCP}}},
				{Hostname: "only-a-name.example.com"},
				{IP: "203.0.113.2", IPMode: &proxy},
			}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
		},
	}
}

// serviceRecord is the record of fullService: everything the planner, the
// proxy and hook plugins read, nothing else.
func serviceRecord() *Service {
	return &Service{
		Meta:        Meta{Namespace: "shop", Name: "web", ResourceVersion: "42"},
		Created:     created.Time,
		Labels:      map[string]string{"app": "web", "weir.dev/canary": "10"},
		Annotations: map[string]string{"weir.dev/weight": "3"}, // not kubectl's last-applied copy
		Type:        corev1.ServiceTypeLoadBalancer,
		ClusterIP:   "10.96.0.10",
		ClusterIPs:  []string{"10.96.0.10", "fd00::10"},
		Ports: []ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053},
		},
		ExternalIPs:              []string{"192.0.2.1"},
		LoadBalancerSourceRanges: []string{"10.0.0.0/8"},
		ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyLocal,
		InternalTrafficPolicy:    corev1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort:      31000,
		SessionAffinity:          corev1.ServiceAffinityClientIP,
		AffinityTimeout:          60,
		Ingress: []Ingress{
			{IP: "203.0.113.1", IPMode: corev1.LoadBalancerIPModeVIP},
			{}, // the position stays: problems name ingress entries by index
			{IP: "203.0.113.2", IPMode: corev1.LoadBalancerIPModeProxy},
		},
	}
}

func fullSlice() *discoveryv1.EndpointSlice {
	yes, no := true, false
	node, zone := "node-a", "zone-a"
	return &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: fullMeta(map[string]string{
			discoveryv1.LabelServiceName:               "web",
			discoveryv1.LabelManagedBy:                 "endpointslice-controller.k8s.io",
			corev1.IsHeadlessService:                   "",
			"app":                                      "web", // the controller copies the Service's labels
			"service.kubernetes.io/service-proxy-name": "other",
		}, map[string]string{
			corev1.EndpointsLastChangeTriggerTime: "2026-01-02T03:04:05Z",
			"other":                               "x",
		}),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080)), AppProtocol: ptr("http")},
			{Port: ptr(int32(53))},
		},
		Endpoints: append(make([]discoveryv1.Endpoint, 0, 8), // room to spare, as decoders leave it
			discoveryv1.Endpoint{
				Addresses:          []string{"10.244.0.11", "10.244.0.99"},
				Conditions:         discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				Hostname:           ptr("web-0"),
				TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-0", UID: "u0", ResourceVersion: "9"},
				DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-a"},
				NodeName:           &node,
				Zone:               &zone,
				Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}},
			},
			discoveryv1.Endpoint{}, // no address: a problem at index 1
			discoveryv1.Endpoint{Addresses: []string{"10.244.0.12"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		),
	}
}

// sliceRecord is the record of fullSlice.
func sliceRecord() *EndpointSlice {
	return &EndpointSlice{
		Meta:        Meta{Namespace: "shop", Name: "web", ResourceVersion: "42"},
		Service:     "web",
		Headless:    true,
		TriggerTime: "2026-01-02T03:04:05Z",
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []EndpointPort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: ptr(int32(8080))},
			{Protocol: corev1.ProtocolTCP, Port: ptr(int32(53))}, // the API's defaults
		},
		Endpoints: []Endpoint{
			{
				Address: "10.244.0.11", // kube-proxy, and Weir, use the first only
				Ready:   true, Serving: true,
				Pod:      "web-0",
				NodeName: "node-a",
				Zone:     "zone-a",
				Hints:    &Hints{ForZones: []string{"zone-a"}, ForNodes: []string{"node-a"}},
			},
			{NoAddress: true, Ready: true, Serving: true}, // missing conditions read as the API defines them
			{Address: "10.244.0.12", Serving: true},
		},
	}
}

func fullNode() *corev1.Node {
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: fullMeta(map[string]string{corev1.LabelTopologyZone: "zone-a", corev1.LabelHostname: "node-a"},
			map[string]string{"node.alpha.kubernetes.io/ttl": "0"}),
		Spec: corev1.NodeSpec{
			PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:244::/64"}, ProviderID: "cloud://node-a",
			Unschedulable: true,
			Taints: []corev1.Taint{
				{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule},
				{Key: ToBeDeletedTaint, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule, TimeAdded: &created},
			},
		},
		Status: corev1.NodeStatus{
			Capacity:   corev1.ResourceList{corev1.ResourceCPU: {}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeHostName, Address: "node-a"}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.example.com/big:1"}, SizeBytes: 1 << 30}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
		},
	}
}

// nodeRecord is the record of fullNode.
func nodeRecord() *Node {
	return &Node{
		Meta:        Meta{Namespace: "shop", Name: "web", ResourceVersion: "42"},
		Zone:        "zone-a",
		PodCIDRs:    []string{"10.244.0.0/24", "fd00:244::/64"},
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeHostName, Address: "node-a"}},
		Deleting:    true,
		ToBeDeleted: true,
	}
}

// TestRecordsKeepWhatWeirReads makes records of objects with every field
// set, directly and through Transform, as the informers do: each keeps what
// Weir reads and nothing else. Transform passes records through, since
// client-go's streaming lists may transform an object twice.
func TestRecordsKeepWhatWeirReads(t *testing.T) {
	c := NewCompactor()
	for _, tt := range []struct {
		name string
		in   func() any
		make func(any) any
		want any
	}{
		{"Service", func() any { return fullService() }, func(o any) any { return c.Service(o.(*corev1.Service)) }, serviceRecord()},
		{"EndpointSlice", func() any { return fullSlice() }, func(o any) any { return c.EndpointSlice(o.(*discoveryv1.EndpointSlice)) }, sliceRecord()},
		{"Node", func() any { return fullNode() }, func(o any) any { return c.Node(o.(*corev1.Node)) }, nodeRecord()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.make(tt.in())
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("record\n%+v\nwant\n%+v", got, tt.want)
			}
			through, err := c.Transform(tt.in())
			if err != nil || !reflect.DeepEqual(through, tt.want) {
				t.Errorf("Transform: %+v, %v", through, err)
			}
			if again, err := c.Transform(through); err != nil || again != through {
				t.Errorf("Transform of a record: %+v, %v; want the record itself", again, err)
			}
		})
	}
}

// TestRecordsOfNothing: a nil object has a nil record, and a nil record a
// nil object.
func TestRecordsOfNothing(t *testing.T) {
	c := NewCompactor()
	if c.Service(nil) != nil || c.EndpointSlice(nil) != nil || c.Node(nil) != nil {
		t.Errorf("records of nil objects are not nil")
	}
	if (*Service)(nil).Object() != nil || (*EndpointSlice)(nil).Object() != nil || (*Node)(nil).Object() != nil {
		t.Errorf("objects of nil records are not nil")
	}
}

func TestTransformLeavesOtherObjects(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: fullMeta(nil, nil)}
	got, err := NewCompactor().Transform(cm)
	if err != nil || got != cm {
		t.Errorf("a ConfigMap was changed: %+v, %v", got, err)
	}
}

// TestObjectsHoldTheRecord makes objects of records, as a handler that
// takes objects gets them: their records are the records again.
func TestObjectsHoldTheRecord(t *testing.T) {
	c := NewCompactor()
	if got := c.Service(serviceRecord().Object()); !got.Same(serviceRecord()) || got.ResourceVersion != "42" {
		t.Errorf("Service: %+v", got)
	}
	if got := c.EndpointSlice(sliceRecord().Object()); !reflect.DeepEqual(got, sliceRecord()) {
		t.Errorf("EndpointSlice: %+v", got)
	}
	if got := c.Node(nodeRecord().Object()); !reflect.DeepEqual(got, nodeRecord()) {
		t.Errorf("Node: %+v", got)
	}
}

// TestSame: records are the same when only their resource versions
// differ.
func TestSame(t *testing.T) {
	a, b := serviceRecord(), serviceRecord()
	b.ResourceVersion = "43"
	b.Created = b.Created.In(time.FixedZone("elsewhere", 3600)) // the same instant
	if !a.Same(b) {
		t.Errorf("Services differing in resource version and time zone are not the same")
	}
	b.Ports[0].Port = 81
	if a.Same(b) {
		t.Errorf("Services with other ports are the same")
	}
	s1, s2 := sliceRecord(), sliceRecord()
	s2.ResourceVersion = "43"
	if !s1.Same(s2) {
		t.Errorf("slices differing in resource version are not the same")
	}
	s2.Endpoints[0].Ready = false
	if s1.Same(s2) {
		t.Errorf("slices with other conditions are the same")
	}
	n1, n2 := nodeRecord(), nodeRecord()
	n2.ResourceVersion = "43"
	if !n1.Same(n2) {
		t.Errorf("Nodes differing in resource version are not the same")
	}
}

// sameText reports whether two strings share their bytes.
func sameText(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

func TestCompactorSharesRepeatedValues(t *testing.T) {
	c := NewCompactor()
	a, b := c.EndpointSlice(fullSlice()), c.EndpointSlice(fullSlice())
	ea, eb := a.Endpoints[0], b.Endpoints[0]
	switch {
	case !sameText(ea.NodeName, eb.NodeName) || !sameText(ea.Zone, eb.Zone):
		t.Errorf("node name or zone not shared between two slices")
	case !sameText(a.Namespace, b.Namespace) || !sameText(a.Ports[0].Name, b.Ports[0].Name):
		t.Errorf("namespace or port name not shared")
	case a.Ports[0].Port != b.Ports[0].Port:
		t.Errorf("port numbers not shared")
	}
	x, y := c.Service(fullService()), c.Service(fullService())
	if !sameText(string(x.InternalTrafficPolicy), string(y.InternalTrafficPolicy)) || !sameText(string(x.Type), string(y.Type)) {
		t.Errorf("traffic policy or type not shared")
	}
}

func TestCompactorSharesABoundedNumberOfValues(t *testing.T) {
	c := NewCompactor()
	for i := range maxShared + 10 {
		s := fullSlice()
		node := "node-" + strconv.Itoa(i)
		s.Endpoints[0].NodeName = &node
		if r := c.EndpointSlice(s); r.Endpoints[0].NodeName != node {
			t.Fatalf("node name %q, want %q", r.Endpoints[0].NodeName, node)
		}
	}
	if n := len(c.strings); n > maxShared {
		t.Errorf("%d strings shared, more than %d", n, maxShared)
	}
}

// TestMetaKeysRecords: client-go's stores key records by namespace and
// name, as they key objects.
func TestMetaKeysRecords(t *testing.T) {
	var o metav1.Object = sliceRecord()
	if o.GetNamespace() != "shop" || o.GetName() != "web" || o.GetResourceVersion() != "42" || o.GetUID() != "" {
		t.Errorf("metadata %s/%s@%s", o.GetNamespace(), o.GetName(), o.GetResourceVersion())
	}
	o.SetResourceVersion("7")
	o.SetLabels(map[string]string{"a": "b"}) // not kept
	if o.GetResourceVersion() != "7" || o.GetLabels() != nil {
		t.Errorf("after setting: %s, %v", o.GetResourceVersion(), o.GetLabels())
	}
	if s := serviceRecord(); s.GetLabels()["app"] != "web" || !s.GetCreationTimestamp().Time.Equal(created.Time) {
		t.Errorf("a Service's labels and creation time do not read as the record's")
	}
}
