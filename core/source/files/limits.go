package files

import (
	"bytes"
	"encoding/json"
	"strings"
)

// maxObjectBytes is the largest object the source decodes: 1.5 MiB, the
// API server's (etcd's) limit on one request. A YAML document over it is
// skipped before it is decoded, so a huge annotation costs no more than
// reading it.
const maxObjectBytes = 3 << 19

// peekJSON returns the kind and namespace/name of a JSON object without
// decoding the rest of it.
func peekJSON(raw []byte) (kind, name string) {
	var o struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Kind, qualified(o.Metadata.Namespace, o.Metadata.Name)
}

// peekYAML returns the kind and namespace/name of a YAML document from its
// top-level kind and the keys right under its top-level metadata, in block
// style, without parsing the rest; what it cannot find stays empty.
func peekYAML(doc []byte) (kind, name string) {
	var namespace string
	inMeta, metaIndent := false, -1
	for line := range bytes.Lines(doc) {
		text := strings.TrimRight(string(line), " \t\r\n")
		trimmed := strings.TrimLeft(text, " ")
		indent := len(text) - len(trimmed)
		if trimmed == "" || trimmed[0] == '#' {
			continue
		}
		if indent == 0 {
			inMeta = trimmed == "metadata:"
			if v, ok := strings.CutPrefix(trimmed, "kind:"); ok {
				kind = scalar(v)
			}
			continue
		}
		if !inMeta {
			continue
		}
		if metaIndent < 0 {
			metaIndent = indent
		}
		if indent != metaIndent {
			continue
		}
		if v, ok := strings.CutPrefix(trimmed, "name:"); ok {
			name = scalar(v)
		} else if v, ok := strings.CutPrefix(trimmed, "namespace:"); ok {
			namespace = scalar(v)
		}
	}
	return kind, qualified(namespace, name)
}

// scalar returns a plain or quoted one-line YAML scalar without its quotes
// or a trailing comment.
func scalar(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
		if end := strings.IndexByte(v[1:], v[0]); end >= 0 {
			return v[1 : end+1]
		}
	}
	if i := strings.Index(v, " #"); i >= 0 {
		v = v[:i]
	}
	return strings.TrimSpace(v)
}

// qualified joins a namespace and a name as namespace/name, or returns the
// name alone.
func qualified(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
