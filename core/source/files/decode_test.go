package files

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/source"
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
	objs, failures := decodeFile(log, source.NewCompactor(), path, []byte(data))
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
	spec := objs[key{kind: kindService, namespace: "default", name: "np"}].(*source.Service)
	svc := spec
	if svc.ResourceVersion != "" {
		t.Errorf("resourceVersion from the manifest kept: %q", svc.ResourceVersion)
	}
	if spec.ClusterIP != "fd00::10" || !slices.Equal(spec.ClusterIPs, []string{"fd00::10", "10.96.0.10"}) {
		t.Errorf("cluster IPs: %q %q", spec.ClusterIP, spec.ClusterIPs)
	}
	if spec.Ports[0].Protocol != corev1.ProtocolTCP || spec.Ports[1].Protocol != corev1.ProtocolUDP {
		t.Errorf("ports: %+v", spec.Ports)
	}
	if spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster ||
		spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		t.Errorf("traffic policies: %q %q", spec.ExternalTrafficPolicy, spec.InternalTrafficPolicy)
	}
	if spec.AffinityTimeout != corev1.DefaultClientIPServiceAffinitySeconds {
		t.Errorf("affinity timeout: %d", spec.AffinityTimeout)
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
	headless := objs[key{kind: kindService, namespace: "default", name: "headless"}].(*source.Service)
	if !slices.Equal(headless.ClusterIPs, []string{"None"}) {
		t.Errorf("headless: %q", headless.ClusterIPs)
	}
	ext := objs[key{kind: kindService, namespace: "default", name: "ext"}].(*source.Service)
	if ext.InternalTrafficPolicy != "" || ext.ExternalTrafficPolicy != "" {
		t.Errorf("ExternalName got traffic policies: %+v", ext)
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
	slice := objs[key{kind: kindEndpointSlice, namespace: "prod", name: "s"}].(*source.EndpointSlice)
	p := slice.Ports[0]
	if p.Name != "" || p.Protocol != corev1.ProtocolTCP || p.Port == nil || *p.Port != 8080 {
		t.Errorf("port: %+v", p)
	}
}
