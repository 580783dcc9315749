package files

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/source"
)

const webService = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: 8080
`

// webSlice returns an EndpointSlice for web with one endpoint per address.
func webSlice(addrs ...string) string {
	var b strings.Builder
	b.WriteString(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
`)
	for _, a := range addrs {
		b.WriteString("- addresses: [\"" + a + "\"]\n  conditions: {ready: true}\n")
	}
	return b.String()
}

func TestInitialLoad(t *testing.T) {
	h := newHarness(t)
	h.write("a-multi.yaml", "# leading comment\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n---\n"+
		webService+"---\n"+webSlice("10.0.0.1", "10.0.0.2")+
		"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ignored\n---\n")
	h.write("b.json", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"api","namespace":"prod"},
		"spec":{"clusterIP":"10.96.0.20","ports":[{"port":443}]}}`)
	h.write("sub/c-list.yml", `apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: list-1, namespace: other}
  addressType: IPv4
  endpoints: []
- apiVersion: v1
  kind: Service
  metadata: {name: list}
  spec: {clusterIP: None}
`)
	h.write("notes.txt", "not a manifest")
	h.write(".hidden.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: hidden\n")

	evs := h.start()
	expectEvents(t, evs,
		"add Node n1",
		"add Service default/list",
		"add Service default/web",
		"add Service prod/api",
		"add EndpointSlice default/web-1",
		"add EndpointSlice other/list-1",
		"Synced")

	seen := map[string]bool{}
	for _, e := range evs[:len(evs)-1] {
		rv := e.cur.GetResourceVersion()
		if rv == "" || seen[rv] {
			t.Errorf("%v: resource version %q is empty or repeated", e, rv)
		}
		seen[rv] = true
	}
	web := evs[2].cur.(*source.Service)
	if web.Ports[0].Protocol != corev1.ProtocolTCP || web.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("web not defaulted: %+v", web)
	}
	slice := evs[4].cur.(*source.EndpointSlice)
	if len(slice.Endpoints) != 2 || slice.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("web-1 = %+v", slice)
	}
	if strings.Contains(h.logs.String(), "level=WARN") {
		t.Errorf("unexpected warnings:\n%s", h.logs)
	}
}

func TestIgnoresOtherKinds(t *testing.T) {
	h := newHarness(t)
	h.write("other.yaml", `apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: knative}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
`)
	expectEvents(t, h.start(), "Synced")
	logs := h.logs.String()
	if strings.Contains(logs, "level=WARN") {
		t.Errorf("ignored kinds logged warnings:\n%s", logs)
	}
	if !strings.Contains(logs, `msg="Ignoring manifest"`) || !strings.Contains(logs, "kind=Deployment") {
		t.Errorf("ignored kinds not logged at debug:\n%s", logs)
	}
}

func TestMalformedDocumentSkipped(t *testing.T) {
	h := newHarness(t)
	h.write("mixed.yaml", webService+`---
apiVersion: v1
kind: Service
metadata: [broken
---
apiVersion: v1
kind: Service
metadata:
  namespace: default
---
apiVersion: v1
kind: Service
metadata: {name: badports}
spec: {ports: "not a list"}
---
`+webSlice("10.0.0.1"))
	expectEvents(t, h.start(), "add Service default/web", "add EndpointSlice default/web-1", "Synced")
	logs := h.logs.String()
	file := h.path("mixed.yaml")
	for _, doc := range []string{"2", "3", "4"} {
		want := `msg="Skipping manifest" file=` + file + " document=" + doc + " error="
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if !strings.Contains(logs, "metadata.name is required") {
		t.Errorf("missing name not explained:\n%s", logs)
	}
}

func TestEndpointRemoved(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1", "10.0.0.2", "10.0.0.3"))
	h.start()
	evs := h.settle(func() {
		h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1", "10.0.0.3"))
	})
	expectEvents(t, evs, "update EndpointSlice default/web-1")
	prev := evs[0].prev.(*source.EndpointSlice)
	cur := evs[0].cur.(*source.EndpointSlice)
	if len(prev.Endpoints) != 3 || len(cur.Endpoints) != 2 || cur.Endpoints[1].Address != "10.0.0.3" {
		t.Errorf("prev %v, cur %v", prev.Endpoints, cur.Endpoints)
	}
	if rv(t, cur) <= rv(t, prev) {
		t.Errorf("resource version did not increase: %s -> %s", prev.ResourceVersion, cur.ResourceVersion)
	}
}

// rv parses an object's resource version.
func rv(t *testing.T, o object) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	if err != nil {
		t.Fatalf("resource version %q: %v", o.GetResourceVersion(), err)
	}
	return n
}

func TestUnchangedRewriteIsSilent(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1"))
	h.start()
	evs := h.settle(func() {
		h.write("web.yaml", "# only a comment changed\n"+webService+"---\n"+webSlice("10.0.0.1"))
	})
	expectEvents(t, evs)
}

func TestFileDeleted(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1"))
	h.write("node.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n")
	h.start()
	evs := h.settle(func() {
		h.remove("web.yaml")
		h.remove("node.yaml")
	})
	expectEvents(t, evs, "delete EndpointSlice default/web-1", "delete Service default/web", "delete Node n1")
	if evs[1].prev.GetResourceVersion() == "" {
		t.Errorf("deleted object has no resource version")
	}
}

func TestMalformedRewriteKeepsLastGood(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1"))
	h.start()

	evs := h.settle(func() { h.write("web.yaml", "::: this is not yaml: [") })
	expectEvents(t, evs)

	changed := strings.Replace(webService, "port: 80", "port: 81", 1)
	evs = h.settle(func() { h.write("web.yaml", changed+"---\nkind: [truncated") })
	expectEvents(t, evs, "update Service default/web")
	if !strings.Contains(h.logs.String(), "keeping the last good definitions") {
		t.Errorf("kept objects not logged:\n%s", h.logs)
	}

	evs = h.settle(func() { h.write("web.yaml", changed) })
	expectEvents(t, evs, "delete EndpointSlice default/web-1")
}

func TestDuplicateAcrossFiles(t *testing.T) {
	h := newHarness(t)
	h.write("a.yaml", webService)
	h.write("b.yaml", strings.Replace(webService, "port: 80", "port: 81", 1))
	evs := h.start()
	expectEvents(t, evs, "add Service default/web", "Synced")
	if port := evs[0].cur.(*source.Service).Ports[0].Port; port != 81 {
		t.Errorf("port = %d, want b.yaml's 81", port)
	}
	want := `msg="Object defined in more than one file; the lexically last file wins" object="Service default/web" file=` + h.path("b.yaml")
	if !strings.Contains(h.logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, h.logs)
	}

	evs = h.settle(func() { h.remove("b.yaml") })
	expectEvents(t, evs, "update Service default/web")
	if port := evs[0].cur.(*source.Service).Ports[0].Port; port != 80 {
		t.Errorf("port = %d, want a.yaml's 80", port)
	}
	evs = h.settle(func() { h.remove("a.yaml") })
	expectEvents(t, evs, "delete Service default/web")
}

func TestNewSubdirectory(t *testing.T) {
	h := newHarness(t)
	h.start()
	evs := h.settle(func() { h.write("sub/deeper/web.yaml", webService) })
	expectEvents(t, evs, "add Service default/web")

	evs = h.settle(func() { h.write("sub/deeper/slice.json", jsonSlice) })
	expectEvents(t, evs, "add EndpointSlice default/web-1")

	evs = h.settle(func() { h.remove("sub") })
	expectEvents(t, evs, "delete EndpointSlice default/web-1", "delete Service default/web")
}

const jsonSlice = `{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
 "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
 "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]}`

func TestConfigMapVolumeSwap(t *testing.T) {
	h := newHarness(t)
	h.write("..2026_01_01/web.yaml", webService)
	symlink(t, "..2026_01_01", h.path("..data"))
	symlink(t, "..data/web.yaml", h.path("web.yaml"))
	evs := h.start()
	expectEvents(t, evs, "add Service default/web", "Synced")

	evs = h.settle(func() {
		// What the kubelet's atomic writer does on a ConfigMap update.
		h.write("..2026_01_02/web.yaml", strings.Replace(webService, "port: 80", "port: 81", 1))
		symlink(t, "..2026_01_02", h.path("..data_tmp"))
		if err := os.Rename(h.path("..data_tmp"), h.path("..data")); err != nil {
			t.Fatal(err)
		}
		h.remove("..2026_01_01")
	})
	expectEvents(t, evs, "update Service default/web")
}

// symlink creates a symbolic link at link pointing to target.
func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestContextCancelReturns(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.stop() // fails the test unless Run returns nil promptly
}

func TestMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	rec := &recorder{}
	err := New(dir, nil).Run(context.Background(), rec)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "source.path") {
		t.Fatalf("Run = %v, want an error naming %s and source.path", err, dir)
	}
	if evs := rec.snapshot(); len(evs) != 0 {
		t.Errorf("handler called: %v", evs)
	}
}
