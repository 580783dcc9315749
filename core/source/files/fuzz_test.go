package files

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/test/scale"
)

// FuzzDecodeFile decodes the fuzz bytes as a whole manifest file, as YAML
// or as JSON, and checks that decoding cannot panic and gives the same
// objects, failures and log twice; that every object sits under its own
// kind, namespace and name with the source's defaults applied and decodes
// again, from its JSON, to itself; that the YAML fast path gives the
// objects sigs.k8s.io/yaml gives; and that every skipped document is
// counted as a failure and logged naming the file, the document and why.
func FuzzDecodeFile(f *testing.F) {
	for _, seed := range []string{
		"",
		"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: default\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nendpoints: [{addresses: [10.244.0.11]}]\nports: [{port: 8080}]\n",
		"apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}}\n",
		"kind: Service\nmetadata: {name: x}\n---\n: bad\n---\n",
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"j","namespace":"d"}}{"kind":"Node"}`,
		webService + "---\n" + webSlice("10.0.0.1", "10.0.0.2"),
		string(scale.Manifest(7, 3, 0)),
		"apiVersion: v1\nkind: Node\nmetadata: {name: Node-A, namespace: x, resourceVersion: '9'}\n" +
			"spec: {podCIDRs: [10.244.0.0/24]}\nstatus: {addresses: [{type: InternalIP, address: 192.168.1.1}]}\n",
		"apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: n1}}\n- {apiVersion: v1, kind: Node}\n- 5\n",
		"# comment only\n---\nkind: [x\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: x}]}\n",
		`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}} {"apiVersion": "v1", "kind": "ConfigMap"} [1]`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool) {
		path := "/manifests/fuzz.yaml"
		if asJSON {
			path = "/manifests/fuzz.json"
		}
		got := decodeRecorded(path, data)
		if again := decodeRecorded(path, data); !got.equal(again) {
			t.Fatalf("two decodes differ:\n%v %d %q\n%v %d %q", got.objs, got.failures, logText(got.logs),
				again.objs, again.failures, logText(again.logs))
		}
		checkDecoded(t, path, got)
		if !asJSON && len(data) <= maxObjectBytes {
			slow := decodeThroughYAML(slog.New(slog.DiscardHandler), path, data)
			if !sameObjects(got.objs, slow) {
				t.Fatalf("the fast path decodes\n%v\nsigs.k8s.io/yaml\n%v", got.objs, slow)
			}
		}
	})
}

// decoded is what decodeFile returned for one file and what it logged.
type decoded struct {
	objs     objects
	failures int
	logs     []slog.Record
}

// decodeRecorded decodes data as the file at path, recording its log.
func decodeRecorded(path string, data []byte) decoded {
	h := &recordHandler{}
	objs, failures := decodeFile(slog.New(h), source.NewCompactor(), path, data)
	return decoded{objs: objs, failures: failures, logs: h.records}
}

// equal reports whether d and o hold the same objects, failures and log.
func (d decoded) equal(o decoded) bool {
	return d.failures == o.failures && sameObjects(d.objs, o.objs) && logText(d.logs) == logText(o.logs)
}

// logText renders records as text, one a line.
func logText(records []slog.Record) string {
	var b strings.Builder
	for _, r := range records {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
		b.WriteByte('\n')
	}
	return b.String()
}

// checkDecoded checks the objects and the log of one decoded file.
func checkDecoded(t *testing.T, path string, d decoded) {
	t.Helper()
	for k, obj := range d.objs {
		if why := objectProblem(k, obj); why != "" {
			t.Fatalf("%s: %s: %s", path, k, why)
		}
		// The object a record makes (for handlers that take objects)
		// holds all the record keeps.
		js, err := json.Marshal(objectOf(obj))
		if err != nil {
			t.Fatalf("%s: %s does not marshal: %v", path, k, err)
		}
		again, failures := decodeFile(slog.New(slog.DiscardHandler), source.NewCompactor(), "/m/again.json", js)
		if failures != 0 || len(again) != 1 || !sameContent(again[k], obj) {
			t.Fatalf("%s: %s decodes again from its object's JSON\n%s\nas %v (%d failures)", path, k, js, again, failures)
		}
	}
	skipped := 0
	for _, r := range d.logs {
		if strings.HasPrefix(r.Message, "Skipping") {
			skipped++
		}
		if why := recordProblem(path, r); why != "" {
			t.Fatalf("%s: log %q: %s", path, logText([]slog.Record{r}), why)
		}
	}
	if skipped != d.failures {
		t.Fatalf("%s: %d failures, %d documents logged as skipped", path, d.failures, skipped)
	}
}

// objectOf returns the object a record makes.
func objectOf(obj object) any {
	switch o := obj.(type) {
	case *source.Service:
		return o.Object()
	case *source.EndpointSlice:
		return o.Object()
	case *source.Node:
		return o.Object()
	}
	return nil
}

// objectProblem returns what is wrong with the record obj decoded under k,
// or "".
func objectProblem(k key, obj object) string {
	kinds := map[kind]string{kindService: "*source.Service", kindEndpointSlice: "*source.EndpointSlice", kindNode: "*source.Node"}
	switch {
	case obj.GetName() == "" || obj.GetName() != k.name || obj.GetNamespace() != k.namespace:
		return fmt.Sprintf("object named %s/%s", obj.GetNamespace(), obj.GetName())
	case (k.kind == kindNode) != (k.namespace == ""):
		return "a Node in a namespace, or a namespaced object outside one"
	case obj.GetResourceVersion() != "":
		return "the manifest's resourceVersion was kept"
	case fmt.Sprintf("%T", obj) != kinds[k.kind]:
		return fmt.Sprintf("a %T decoded as a %s", obj, k.kind)
	}
	if svc, ok := obj.(*source.Service); ok {
		return serviceDefaultsProblem(svc)
	}
	return ""
}

// serviceDefaultsProblem returns which default the source did not apply
// to svc, or "".
func serviceDefaultsProblem(svc *source.Service) string {
	switch {
	case svc.Type == "" || svc.SessionAffinity == "":
		return "no type or session affinity"
	case svc.Type != corev1.ServiceTypeExternalName && svc.InternalTrafficPolicy == "":
		return "no internalTrafficPolicy"
	case externallyAccessible(&corev1.ServiceSpec{Type: svc.Type, ExternalIPs: svc.ExternalIPs}) && svc.ExternalTrafficPolicy == "":
		return "no externalTrafficPolicy"
	case len(svc.ClusterIPs) > 0 && svc.ClusterIP != svc.ClusterIPs[0], svc.ClusterIP != "" && len(svc.ClusterIPs) == 0:
		return "clusterIP and clusterIPs disagree"
	}
	for _, p := range svc.Ports {
		if p.Protocol == "" {
			return "a port without protocol"
		}
	}
	return ""
}

// recordProblem returns what a log record of decoding the file at path
// leaves out, or "": every warning names the file and the document, a
// skipped document says why, and a skipped one naming a field names it.
func recordProblem(path string, r slog.Record) string {
	attrs := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
	if attrs["file"].String() != path || attrs["document"].Kind() != slog.KindInt64 || attrs["document"].Int64() < 1 {
		return "does not name the file and the document"
	}
	switch r.Message {
	case "Skipping manifest":
		err, _ := attrs["error"].Any().(error)
		if err == nil || err.Error() == "" {
			return "gives no reason"
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" && te.Type != reflect.TypeFor[header]() {
			return "a value of the wrong type does not name its field"
		}
	case "Object defined twice in one file; the later definition wins":
		if attrs["object"].String() == "" {
			return "does not name the object"
		}
	}
	return ""
}

// recordHandler is a slog.Handler that keeps every record, at every level.
type recordHandler struct {
	records []slog.Record
}

// Enabled reports that every level is recorded.
func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps a copy of r.
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.records = append(h.records, r.Clone())
	return nil
}

// WithAttrs is not needed by the decoder: it returns h.
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup is not needed by the decoder: it returns h.
func (h *recordHandler) WithGroup(string) slog.Handler { return h }
