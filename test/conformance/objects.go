package conformance

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/source"
)

// object is one decoded manifest: exactly one of its pointers is set.
type object struct {
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
	node  *corev1.Node
}

// key names the object as "Kind namespace/name", or "Node name".
func (o object) key() string {
	switch {
	case o.svc != nil:
		return "Service " + o.svc.Namespace + "/" + o.svc.Name
	case o.slice != nil:
		return "EndpointSlice " + o.slice.Namespace + "/" + o.slice.Name
	}
	return "Node " + o.node.Name
}

// separator splits YAML documents.
var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// kinds maps each kind a row may use to its apiVersion.
var kinds = map[string]string{
	"Service":       "v1",
	"EndpointSlice": "discovery.k8s.io/v1",
	"Node":          "v1",
}

// decodeManifests decodes multi-document YAML strictly: an unknown field is
// an error, so a typo in a row cannot silently change what it tests.
func decodeManifests(text string) ([]object, error) {
	var out []object
	for i, doc := range separator.Split(text, -1) {
		if blank(doc) {
			continue
		}
		o, err := decodeObject([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		out = append(out, o)
	}
	return out, nil
}

func decodeObject(doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return object{}, err
	}
	if v, ok := kinds[head.Kind]; !ok || v != head.APIVersion {
		return object{}, fmt.Errorf("apiVersion %q, kind %q: want Service (v1), EndpointSlice (discovery.k8s.io/v1) or Node (v1)",
			head.APIVersion, head.Kind)
	}
	var o object
	var target any
	switch head.Kind {
	case "Service":
		o.svc = &corev1.Service{}
		target = o.svc
	case "EndpointSlice":
		o.slice = &discoveryv1.EndpointSlice{}
		target = o.slice
	default:
		o.node = &corev1.Node{}
		target = o.node
	}
	if err := yaml.UnmarshalStrict(doc, target); err != nil {
		return object{}, err
	}
	if o.node == nil && namespaceOf(o) == "" {
		return object{}, fmt.Errorf("%s has no namespace", o.key())
	}
	if o.slice != nil && o.slice.Labels[discoveryv1.LabelServiceName] == "" {
		return object{}, fmt.Errorf("%s has no %s label", o.key(), discoveryv1.LabelServiceName)
	}
	return o, nil
}

func namespaceOf(o object) string {
	if o.svc != nil {
		return o.svc.Namespace
	}
	return o.slice.Namespace
}

// blank reports whether a YAML document holds only comments and space.
func blank(doc string) bool {
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// store holds a row's current objects, so that updates and deletions can
// hand the proxy the previous object, as an informer would.
type store struct {
	objs map[string]object
}

func newStore() *store { return &store{objs: map[string]object{}} }

// apply creates o, or replaces the object with its key, through h.
func (s *store) apply(h source.Handler, o object) {
	prev := s.objs[o.key()] // the zero object, all nil, when new
	switch {
	case o.svc != nil:
		h.OnService(prev.svc, o.svc)
	case o.slice != nil:
		h.OnEndpointSlice(prev.slice, o.slice)
	default:
		h.OnNode(prev.node, o.node)
	}
	s.objs[o.key()] = o
}

// delete removes the object named key ("Kind namespace/name") through h.
func (s *store) delete(h source.Handler, key string) error {
	prev, ok := s.objs[key]
	if !ok {
		return fmt.Errorf("delete %q: no such object (want \"Kind namespace/name\" or \"Node name\")", key)
	}
	switch {
	case prev.svc != nil:
		h.OnService(prev.svc, nil)
	case prev.slice != nil:
		h.OnEndpointSlice(prev.slice, nil)
	default:
		h.OnNode(prev.node, nil)
	}
	delete(s.objs, key)
	return nil
}
