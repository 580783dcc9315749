package files

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestReadObjectsKeepsWholeObjects(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: old}
  ports: [{name: http, port: 80, targetPort: http}]
`)
	write("b/web.yaml", `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: web-http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
`)
	write("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [\n")
	objs, err := ReadObjects(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	svc := objs.Services["default/web"]
	if svc == nil || svc.Spec.Selector["app"] != "web" || svc.Spec.Ports[0].TargetPort != intstr.FromString("web-http") {
		t.Fatalf("Services[default/web] = %+v, want the later file's selector and named target port", svc)
	}
	if svc.Spec.Type != "ClusterIP" {
		t.Errorf("type %q, want the default ClusterIP applied", svc.Spec.Type)
	}
	sl := objs.Slices["default/web"]
	if len(sl) != 2 || sl[0].Name != "web-1" || sl[1].Name != "web-2" {
		t.Errorf("Slices[default/web] = %d slices, want web-1 and web-2 in order", len(sl))
	}
	if objs.Nodes["node-a"] == nil || len(objs.Services) != 1 {
		t.Errorf("Nodes %v, %d services; want node-a and one service", objs.Nodes, len(objs.Services))
	}
	if _, err := ReadObjects(filepath.Join(dir, "missing"), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("ReadObjects of a missing folder: no error")
	}
}
