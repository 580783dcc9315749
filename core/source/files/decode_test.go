package files

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/internal/syncbuf"
)

func TestSplitYAML(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"single", "a: 1\n", []string{"a: 1\n"}},
		{"two", "a: 1\n---\nb: 2\n", []string{"a: 1\n", "b: 2\n"}},
		{"leading and trailing", "---\na: 1\n---\n", []string{"", "a: 1\n", ""}},
		{"comment after separator", "a: 1\n--- # next\nb: 2", []string{"a: 1\n", "b: 2"}},
		{"crlf", "a: 1\r\n---\r\nb: 2\r\n", []string{"a: 1\r\n", "b: 2\r\n"}},
		{"not a separator", "a: |\n  ---\nb: ---x\n----\n", []string{"a: |\n  ---\nb: ---x\n----\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, d := range splitYAML([]byte(tt.in)) {
				got = append(got, string(d))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("splitYAML(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// decodeForTest decodes data as path and returns the objects, the failure
// count and the log.
func decodeForTest(t *testing.T, path, data string) (objects, int, string) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	objs, failures := decodeFile(log, path, []byte(data))
	return objs, failures, logs.String()
}

func TestDocumentNumbersSkipEmptyDocuments(t *testing.T) {
	_, failures, logs := decodeForTest(t, "/m/a.yaml", "# header\n---\n---\n# nothing\n---\nkind: [x\n")
	if failures != 1 || !strings.Contains(logs, "file=/m/a.yaml document=1 ") {
		t.Errorf("failures = %d, log:\n%s", failures, logs)
	}
}

func TestListItemErrorsNameTheItem(t *testing.T) {
	objs, failures, logs := decodeForTest(t, "/m/list.json", `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
		{"apiVersion": "v1", "kind": "Node", "metadata": {}}]}
		{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2", "namespace": "x"}}`)
	if failures != 1 || len(objs) != 2 {
		t.Errorf("failures = %d, objects = %v", failures, objs)
	}
	if !strings.Contains(logs, "document=1 item=2 error=") {
		t.Errorf("log does not name the item:\n%s", logs)
	}
	if _, ok := objs[key{kind: kindNode, name: "n2"}]; !ok {
		t.Errorf("second JSON value not decoded, or Node kept its namespace: %v", objs)
	}
}

func TestMissingKindIsAnError(t *testing.T) {
	_, failures, logs := decodeForTest(t, "/m/a.yaml", "metadata: {name: x}\n")
	if failures != 1 || !strings.Contains(logs, "apiVersion and kind are required") {
		t.Errorf("failures = %d, log:\n%s", failures, logs)
	}
}

func TestServiceDefaults(t *testing.T) {
	objs, _, _ := decodeForTest(t, "/m/s.yaml", `apiVersion: v1
kind: Service
metadata: {name: np, resourceVersion: "999"}
spec:
  type: NodePort
  clusterIPs: [fd00::10, 10.96.0.10]
  sessionAffinity: ClientIP
  ports:
  - port: 80
    nodePort: 30080
  - port: 53
    protocol: UDP
    targetPort: dns
`)
	svc := objs[key{kind: kindService, namespace: "default", name: "np"}].(*corev1.Service)
	spec := svc.Spec
	if svc.ResourceVersion != "" {
		t.Errorf("resourceVersion from the manifest kept: %q", svc.ResourceVersion)
	}
	if spec.ClusterIP != "fd00::10" || !slices.Equal(spec.IPFamilies, []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}) {
		t.Errorf("cluster IPs: %q %q %v", spec.ClusterIP, spec.ClusterIPs, spec.IPFamilies)
	}
	if spec.Ports[0].Protocol != corev1.ProtocolTCP || spec.Ports[0].TargetPort != intstr.FromInt32(80) ||
		spec.Ports[1].TargetPort != intstr.FromString("dns") {
		t.Errorf("ports: %+v", spec.Ports)
	}
	if spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster ||
		spec.InternalTrafficPolicy == nil || *spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		t.Errorf("traffic policies: %q %v", spec.ExternalTrafficPolicy, spec.InternalTrafficPolicy)
	}
	if c := spec.SessionAffinityConfig; c == nil || *c.ClientIP.TimeoutSeconds != corev1.DefaultClientIPServiceAffinitySeconds {
		t.Errorf("affinity config: %+v", c)
	}
}

func TestHeadlessAndExternalNameDefaults(t *testing.T) {
	objs, _, _ := decodeForTest(t, "/m/s.yaml", `apiVersion: v1
kind: Service
metadata: {name: headless}
spec: {clusterIP: None, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec: {type: ExternalName, externalName: example.com}
`)
	headless := objs[key{kind: kindService, namespace: "default", name: "headless"}].(*corev1.Service)
	if !slices.Equal(headless.Spec.ClusterIPs, []string{"None"}) || headless.Spec.IPFamilies != nil {
		t.Errorf("headless: %q %v", headless.Spec.ClusterIPs, headless.Spec.IPFamilies)
	}
	ext := objs[key{kind: kindService, namespace: "default", name: "ext"}].(*corev1.Service)
	if ext.Spec.InternalTrafficPolicy != nil || ext.Spec.ExternalTrafficPolicy != "" {
		t.Errorf("ExternalName got traffic policies: %+v", ext.Spec)
	}
}

func TestEndpointSliceDefaults(t *testing.T) {
	objs, _, _ := decodeForTest(t, "/m/e.yaml", `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, namespace: prod}
addressType: IPv4
ports: [{port: 8080}]
endpoints: []
`)
	slice := objs[key{kind: kindEndpointSlice, namespace: "prod", name: "s"}].(*discoveryv1.EndpointSlice)
	p := slice.Ports[0]
	if p.Name == nil || *p.Name != "" || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
		t.Errorf("port: %+v", p)
	}
}
