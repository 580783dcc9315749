package files

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/source"
)

// kind is one of the object kinds the source delivers, in delivery order.
type kind int

const (
	kindNode kind = iota
	kindService
	kindEndpointSlice
)

// String returns the Kubernetes kind name.
func (k kind) String() string {
	switch k {
	case kindNode:
		return "Node"
	case kindService:
		return "Service"
	case kindEndpointSlice:
		return "EndpointSlice"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// key identifies an object: (kind, namespace, name).
type key struct {
	kind      kind
	namespace string
	name      string
}

// String formats the key for logs as Kind namespace/name.
func (k key) String() string {
	if k.namespace == "" {
		return k.kind.String() + " " + k.name
	}
	return k.kind.String() + " " + k.namespace + "/" + k.name
}

// object is the record of a decoded Service, EndpointSlice or Node
// (*source.Service, *source.EndpointSlice or *source.Node).
type object interface {
	GetNamespace() string
	GetName() string
	GetResourceVersion() string
	SetResourceVersion(string)
}

// objects is the set of objects one file defines.
type objects map[key]object

// header is the part of every manifest read before its kind is known.
type header struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
}

// isManifest reports whether a file name has a manifest extension.
func isManifest(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// fileDecoder collects the objects of one file, logging documents it skips.
type fileDecoder struct {
	log      *slog.Logger
	compact  *source.Compactor
	path     string
	objs     objects
	failures int
}

// decodeFile decodes every document in data into records made by compact,
// or into the decoded objects themselves when compact is nil; failures counts the documents that could not be used, so the caller can
// keep earlier definitions.
func decodeFile(log *slog.Logger, compact *source.Compactor, path string, data []byte) (objs objects, failures int) {
	d := &fileDecoder{log: log, compact: compact, path: path, objs: objects{}}
	if strings.EqualFold(filepath.Ext(path), ".json") {
		d.jsonStream(data)
	} else {
		n := 0
		for _, doc := range splitYAML(data) {
			if hasContent(doc) {
				n++
				d.yamlDocument(n, doc)
			}
		}
	}
	return d.objs, d.failures
}

// jsonStream decodes a file holding one or more concatenated JSON values.
func (d *fileDecoder) jsonStream(data []byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			d.skip(doc, 0, err)
			return
		}
		if len(raw) > maxObjectBytes {
			if kind, name := peekJSON(raw); kind != "List" {
				d.tooLarge(doc, 0, len(raw), kind, name)
				continue
			}
		}
		d.value(doc, 0, raw, nil)
	}
}

// yamlDocument decodes one YAML document, converting it to JSON through
// fastYAMLToJSON when it can and through sigs.k8s.io/yaml otherwise. A
// document over the object size limit is skipped before it is decoded,
// unless it is a List, whose items are checked one by one.
func (d *fileDecoder) yamlDocument(doc int, data []byte) {
	if len(data) > maxObjectBytes {
		if kind, name := peekYAML(data); kind != "List" {
			d.tooLarge(doc, 0, len(data), kind, name)
			return
		}
	}
	p := getParser()
	defer putParser(p)
	if js, header, ok := p.convert(data); ok {
		d.value(doc, 0, js, header)
		return
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		d.skip(doc, 0, err)
		return
	}
	d.value(doc, 0, js, nil)
}

// value decodes one JSON value: a List, a supported object, or anything
// else. If headerJS is not nil, the header is decoded from it instead of js,
// as fastYAMLToJSON allows.
func (d *fileDecoder) value(doc, item int, js, headerJS []byte) {
	trimmed := bytes.TrimSpace(js)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return // empty document, e.g. only comments
	}
	if headerJS == nil {
		headerJS = trimmed
	}
	var h header
	if err := json.Unmarshal(headerJS, &h); err != nil {
		d.skip(doc, item, err)
		return
	}
	if h.Kind == "" || h.APIVersion == "" {
		d.skip(doc, item, errors.New("apiVersion and kind are required"))
		return
	}
	if h.Kind == "List" && item == 0 {
		for i, it := range h.Items {
			if len(it) > maxObjectBytes {
				kind, name := peekJSON(it)
				d.tooLarge(doc, i+1, len(it), kind, name)
				continue
			}
			d.value(doc, i+1, it, nil)
		}
		return
	}
	obj, k, err := decodeObject(d.compact, h, trimmed)
	switch {
	case err != nil:
		d.skip(doc, item, err)
	case obj == nil:
		d.log.Debug("Ignoring manifest", d.where(doc, item, "apiVersion", h.APIVersion, "kind", h.Kind)...)
	default:
		d.add(doc, item, k, obj)
	}
}

// add records obj, warning if the same file already defined it.
func (d *fileDecoder) add(doc, item int, k key, obj object) {
	if _, dup := d.objs[k]; dup {
		d.log.Warn("Object defined twice in one file; the later definition wins",
			d.where(doc, item, "object", k.String())...)
	}
	d.objs[k] = obj
}

// skip logs a document that cannot be used and counts it as a failure.
func (d *fileDecoder) skip(doc, item int, err error) {
	d.failures++
	d.log.Warn("Skipping manifest", d.where(doc, item, "error", err)...)
}

// tooLarge logs an object over the size limit, skipped, as a failure.
func (d *fileDecoder) tooLarge(doc, item, size int, kind, name string) {
	d.failures++
	d.log.Warn("Skipping a manifest object that is too large", d.where(doc, item,
		"kind", kind, "name", name, "bytes", size, "limitBytes", maxObjectBytes)...)
}

// where returns log attributes naming the file, document and list item.
func (d *fileDecoder) where(doc, item int, extra ...any) []any {
	args := []any{"file", d.path, "document", doc}
	if item > 0 {
		args = append(args, "item", item)
	}
	return append(args, extra...)
}

// decodeObject decodes a supported kind into a fresh object with defaults
// applied, and returns its record made by compact (the object itself when
// compact is nil); it returns a nil object for kinds the source ignores.
func decodeObject(compact *source.Compactor, h header, js []byte) (object, key, error) {
	var obj kubeObject
	var k kind
	switch {
	case h.APIVersion == "v1" && h.Kind == "Service":
		obj, k = &corev1.Service{}, kindService
	case h.APIVersion == "discovery.k8s.io/v1" && h.Kind == "EndpointSlice":
		obj, k = &discoveryv1.EndpointSlice{}, kindEndpointSlice
	case h.APIVersion == "v1" && h.Kind == "Node":
		obj, k = &corev1.Node{}, kindNode
	default:
		return nil, key{}, nil
	}
	if err := json.Unmarshal(js, obj); err != nil {
		return nil, key{}, err
	}
	if obj.GetName() == "" {
		return nil, key{}, errors.New("metadata.name is required")
	}
	normalize(k, obj)
	if compact == nil {
		return obj, key{kind: k, namespace: obj.GetNamespace(), name: obj.GetName()}, nil
	}
	rec, err := compact.Transform(obj)
	if err != nil {
		return nil, key{}, err
	}
	return rec.(object), key{kind: k, namespace: obj.GetNamespace(), name: obj.GetName()}, nil
}

// kubeObject is a decoded Service, EndpointSlice or Node.
type kubeObject interface {
	metav1.Object
	runtime.Object
}

// normalize fixes the namespace, clears the manifest's resource version (the
// source sets its own) and applies the API server's simple defaults.
func normalize(k kind, obj kubeObject) {
	obj.SetResourceVersion("")
	switch k {
	case kindNode:
		obj.SetNamespace("")
	default:
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
	}
	switch o := obj.(type) {
	case *corev1.Service:
		defaultService(o)
	case *discoveryv1.EndpointSlice:
		defaultEndpointSlice(o)
	}
}

// splitYAML splits a multi-document YAML stream on "---" separator lines. A
// separator may be followed by spaces or a comment only; documents keep their
// original line breaks so parse errors still point at sensible lines.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	start := 0
	for pos := 0; pos < len(data); {
		end := bytes.IndexByte(data[pos:], '\n')
		next := len(data)
		if end >= 0 {
			next = pos + end + 1
		}
		if isSeparator(data[pos:next]) {
			docs = append(docs, data[start:pos])
			start = next
		}
		pos = next
	}
	return append(docs, data[start:])
}

// isSeparator reports whether line is a YAML document separator.
func isSeparator(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}

// hasContent reports whether a YAML document has anything besides blank
// lines and comments; empty documents are not counted or decoded.
func hasContent(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return true
		}
	}
	return false
}
