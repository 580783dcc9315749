package files

import (
	"bytes"
	"log/slog"
	"reflect"
	"testing"
)

// FuzzDecodeFile feeds arbitrary bytes, as a YAML and as a JSON file, to
// the decoder of whole manifest files: it never panics, gives the same
// objects and failures twice, keys each object by its own kind, namespace
// and name, and logs every failure with the file's path.
func FuzzDecodeFile(f *testing.F) {
	for _, seed := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: default\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nendpoints: [{addresses: [10.244.0.11]}]\nports: [{port: 8080}]\n",
		"apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}}\n",
		"kind: Service\nmetadata: {name: x}\n---\n: bad\n---\n",
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"j","namespace":"d"}}{"kind":"Node"}`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool) {
		path := "/manifests/fuzz.yaml"
		if asJSON {
			path = "/manifests/fuzz.json"
		}
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		objs, failures := decodeFile(log, path, data)
		again, failuresAgain := decodeFile(slog.New(slog.DiscardHandler), path, data)
		if failures != failuresAgain || !reflect.DeepEqual(objs, again) {
			t.Fatalf("two decodes differ: %d objects, %d failures, then %d and %d", len(objs), failures, len(again), failuresAgain)
		}
		if failures > 0 && !bytes.Contains(logs.Bytes(), []byte(path)) {
			t.Errorf("%d failures, but the log does not name the file:\n%s", failures, logs.String())
		}
		for k, obj := range objs {
			if obj.GetName() != k.name || obj.GetNamespace() != k.namespace {
				t.Errorf("%v holds %s/%s", k, obj.GetNamespace(), obj.GetName())
			}
			if got := obj.GetObjectKind().GroupVersionKind().Kind; got != "" && got != k.kind.String() {
				t.Errorf("%v holds a %s", k, got)
			}
		}
	})
}
