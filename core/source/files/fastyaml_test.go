package files

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/test/scale"
)

// scaleDoc returns document i (0: the Service, 1: the EndpointSlice) of a
// generated benchmark manifest.
func scaleDoc(i int) string {
	return strings.Split(string(scale.Manifest(4242, 10, 0)), "---\n")[i]
}

// fastAccepted are documents fastYAMLToJSON must convert itself.
var fastAccepted = []string{
	webService,
	webSlice("10.0.0.1", "10.0.0.2"),
	scaleDoc(0),
	scaleDoc(1),
	"a: 1\n",
	"# head\na: x # tail\n\n  # indented comment\nb: 'single'  # c\nc: \"double # not a comment\"\n",
	"a:\nb: x~\nc: # nothing\nd: null\ne: Null\nf: yes\ng: Off\nh: n\n",
	"a:\n- x\n- y\nb:\n  - 1\n  - 2\n",
	"a:\n- name: x\n  ports:\n  - port: 80\n    protocol: TCP\n  - port: 81\n- name: y\n",
	"-\n  a: 1\n- # c\n- b\n-   c: 2\n    d: 3\n",
	"a: [1, two, \"3\", 'four', [five], {six: 6}]\nb: {}\nc: []\nd: { x: [ ], w: {z: true} }\n",
	"uid: 6f1d2c1e-5b0a-4a53-9c55-0d2d1f0c9a11\nip: 10.244.2.17\nv6: fd00::10\nhost: 1host\n",
	"html: a <b href=x>&amp;</b>\nquote: say \"hi\"\nback: c:\\dir\\x\nrest: a,b [c] {d} ]e\n",
	"url: http://example.com:8080/x?y=z#frag\nimage: nginx:1.25\nempty: ''\nz: \"\"\n",
	"num: 0\nbig: 123456789012345678\nzero: '007'\n",
	"x_: y\nz: /path\nw: _under\ntime: 12:30\n",
	"a:\n  b:\n    c:\n      d: deep\n  e: back\nf: top\n",
	"k: {ready: true, serving: false}\nl: [\"10.0.0.1\"]\n",
}

// fastDeclined are documents fastYAMLToJSON must leave to YAMLToJSON.
var fastDeclined = []string{
	"a: &x 1\nb: *x\n",
	"a: !!str 1\n",
	"a: |\n  text\n",
	"a: >-\n  text\n",
	"a: multi\n  line\n",
	"a: 1.5\n", "a: 010\n", "a: 0x1f\n", "a: 1_000\n", "a: 1e3\n", "a: -1\n", "a: +1\n", "a: .inf\n",
	"a: 2026-01-01\n", "a: 1234567890123456789\n", "y: 1\n", "_x: 1\n", "a: ~x\n",
	"a: 1\na: 2\n",
	"y: 1\n", "on: 1\n", "80: http\n",
	"\"a\": 1\n",
	"a: [1,\n  2]\n",
	"a: [1, 2,]\n",
	"a: {b:1}\n",
	"a: \"esc\\n\"\n",
	"a: 'it''s'\n",
	"a: b: c\n",
	"a: b:\n",
	"a:\tb\n",
	"a: 1\r\n",
	"a: caf\xc3\xa9\n",
	"  a: 1\n",
	"a:\n  b: 1\n c: 2\n",
	"a:\n  - x\n  b: 1\n",
	"- - x\n",
	"a:\n  just a scalar\n",
	"? a\n: b\n",
	"a: <<\n", "<<: {}\n",
	"%YAML 1.1\n",
	"[a, b]\n",
	"a: [x] y\n",
	"a: \"x\"y\n",
	"a: @x\n",
	"- a: 1\n    b: 2\n",
	"a: " + strings.Repeat("[", 101) + strings.Repeat("]", 101) + "\n",
}

// checkFast converts doc with the fast path and, if it accepts it, fails
// unless YAMLToJSON gives the same JSON and the header decodes the same from
// the reduced header JSON as from the whole document. It reports whether the
// fast path accepted doc.
func checkFast(t *testing.T, doc []byte) bool {
	t.Helper()
	var p yamlParser
	got, headerJS, ok := p.convert(doc)
	if !ok {
		return false
	}
	want, err := yaml.YAMLToJSON(doc)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("document %q:\ngot  %s\nwant %s (%v)", doc, got, want, err)
		return true
	}
	if headerJS == nil {
		return true
	}
	var fromHeader, fromAll header
	errHeader := json.Unmarshal(headerJS, &fromHeader)
	errAll := json.Unmarshal(want, &fromAll)
	if fmt.Sprint(errHeader) != fmt.Sprint(errAll) || !reflect.DeepEqual(fromHeader, fromAll) {
		t.Errorf("document %q: header from %s is %+v (%v), from the whole document %+v (%v)",
			doc, headerJS, fromHeader, errHeader, fromAll, errAll)
	}
	return true
}

func TestFastYAMLMatchesYAMLToJSON(t *testing.T) {
	for _, doc := range fastAccepted {
		if !checkFast(t, []byte(doc)) {
			t.Errorf("declined:\n%s", doc)
		}
	}
}

func TestHeaderFromReducedJSON(t *testing.T) {
	docs := []string{
		"apiVersion: v1\nkind: List\nitems:\n- kind: Node\n  apiVersion: v1\n",
		"APIVERSION: v1\nKind: Service\nmetadata: {name: x}\n",
		"apiVersion: v1\nkind: [Service]\n",
		"apiVersion: 1\nkind: Service\n",
		"apiVersion: v1\nkind: Service\nitems: 5\n",
		"apiVersion: v1\nkind: Service\nItems: {a: b}\nITEMS: [x]\n",
		"api_version: v1\nkind: null\nkind-: x\n",
		"metadata: {kind: x}\n",
	}
	for _, doc := range docs {
		if !checkFast(t, []byte(doc)) {
			t.Errorf("declined:\n%s", doc)
		}
	}
}

func TestFastYAMLDeclines(t *testing.T) {
	for _, doc := range fastDeclined {
		if got, ok := fastYAMLToJSON([]byte(doc)); ok {
			t.Errorf("accepted %q as %s", doc, got)
		}
	}
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	var ascii []byte
	for c := byte(' '); c <= '~'; c++ {
		ascii = append(ascii, c)
	}
	want, err := json.Marshal(string(ascii))
	if err != nil {
		t.Fatal(err)
	}
	if got := appendJSONString(nil, ascii); !bytes.Equal(got, want) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// FuzzFastYAML checks that whatever fastYAMLToJSON accepts, YAMLToJSON
// accepts too and converts to the same bytes.
func FuzzFastYAML(f *testing.F) {
	for _, doc := range append(fastAccepted, fastDeclined...) {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) { checkFast(t, doc) })
}

// TestFastYAMLRandomDocuments compares fastYAMLToJSON with YAMLToJSON on
// documents put together at random from lines manifests are made of, valid
// or not, so that many of them take the fast path.
func TestFastYAMLRandomDocuments(t *testing.T) {
	keys := []string{"a", "b", "name", "ports", "y", "On", "x.io/k-1", "c", "kind", "apiVersion", "items"}
	values := []string{"", "x", "two words", "yes", "NULL", "0", "010", "1.5", "12:30", "10.0.0.1", "6f1d-2c",
		"2026-01-01", "0x1F", "1e3", "'q'", `"d q"`, "'a''b'", `"e\n"`, "[a, 1]", "{k: v}", "[]", "{}", "[a,",
		"a #c", "a: b", "<&>", "~", "-", "- x", "|", "&a x", "*a", "!t x", "/p", "_u", "x:", "c:\\d", "[a] b"}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func(s []string) string { return s[rnd.IntN(len(s))] }
	accepted := 0
	for range 20000 {
		var doc strings.Builder
		for range 1 + rnd.IntN(8) {
			doc.WriteString(strings.Repeat(" ", rnd.IntN(3)*2))
			switch rnd.IntN(6) {
			case 0, 1:
				doc.WriteString(pick(keys) + ": " + pick(values))
			case 2:
				doc.WriteString(pick(keys) + ":")
			case 3:
				doc.WriteString("- " + pick(values))
			case 4:
				doc.WriteString("- " + pick(keys) + ": " + pick(values))
			default:
				doc.WriteString("# " + pick(values))
			}
			doc.WriteString("\n")
		}
		if checkFast(t, []byte(doc.String())) {
			accepted++
		}
	}
	if accepted < 300 {
		t.Errorf("only %d random documents took the fast path", accepted)
	}
}

// TestFastYAMLRandomTrees compares fastYAMLToJSON with YAMLToJSON on random
// nested mappings and sequences in the styles manifests use, some with one
// line's indentation shifted.
func TestFastYAMLRandomTrees(t *testing.T) {
	g := &treeGen{rnd: rand.New(rand.NewPCG(3, 4))}
	accepted := 0
	for range 20000 {
		var lines []string
		g.mapping(&lines, "", 3)
		if g.rnd.IntN(4) == 0 {
			i := g.rnd.IntN(len(lines))
			if g.rnd.IntN(2) == 0 {
				lines[i] = " " + lines[i]
			} else {
				lines[i] = strings.TrimPrefix(lines[i], " ")
			}
		}
		if checkFast(t, []byte(strings.Join(lines, "\n")+"\n")) {
			accepted++
		}
	}
	if accepted < 4000 {
		t.Errorf("only %d random documents took the fast path", accepted)
	}
}

// treeGen writes random block-style YAML.
type treeGen struct{ rnd *rand.Rand }

// scalar returns a random inline value.
func (g *treeGen) scalar() string {
	values := []string{"x", "two words", "true", "off", "null", "0", "8080", "10.0.0.1", "6f1d2c1e-5b0a", "nginx:1.25",
		"'q'", `"d q"`, "[a, 1]", "{k: v, w: [x]}", "[]", "{}", "a #c", "x<&>", "/p", "x # c", "007", "1.5"}
	return values[g.rnd.IntN(len(values))]
}

// keys returns one to four random keys, now and then with a repeat or a key
// YAML reads as a boolean.
func (g *treeGen) keys() []string {
	keys := []string{"a", "b", "name", "ports", "x.io/k-1", "c", "protocol", "kind", "apiVersion", "Items", "api_version"}
	g.rnd.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	keys = keys[:1+g.rnd.IntN(4)]
	switch g.rnd.IntN(20) {
	case 0:
		keys = append(keys, keys[0])
	case 1:
		keys = append(keys, "no")
	}
	return keys
}

// mapping appends a mapping's lines.
func (g *treeGen) mapping(lines *[]string, indent string, depth int) {
	for _, k := range g.keys() {
		*lines = append(*lines, indent+k+":")
		g.value(lines, indent, depth, true)
	}
}

// value completes the last line with an inline value, or appends a nested block.
func (g *treeGen) value(lines *[]string, indent string, depth int, indentless bool) {
	last := len(*lines) - 1
	switch n := g.rnd.IntN(5); {
	case depth == 0 || n < 2:
		(*lines)[last] += " " + g.scalar()
	case n == 2:
		g.mapping(lines, indent+"  ", depth-1)
	default:
		inner := indent + "  "
		if indentless && g.rnd.IntN(2) == 0 {
			inner = indent
		}
		g.sequence(lines, inner, depth-1)
	}
}

// sequence appends a block sequence's lines.
func (g *treeGen) sequence(lines *[]string, indent string, depth int) {
	for range 1 + g.rnd.IntN(3) {
		switch g.rnd.IntN(3) {
		case 0:
			*lines = append(*lines, indent+"- "+g.scalar())
		case 1:
			*lines = append(*lines, indent+"-")
			g.value(lines, indent, depth, false)
		default:
			start := len(*lines)
			g.mapping(lines, indent+"  ", depth)
			(*lines)[start] = indent + "- " + strings.TrimPrefix((*lines)[start], indent+"  ")
		}
	}
}

// decodeThroughYAML decodes a YAML file as decodeFile did before the fast
// path: every document through sigs.k8s.io/yaml.
func decodeThroughYAML(log *slog.Logger, path string, data []byte) objects {
	d := &fileDecoder{log: log, compact: source.NewCompactor(), path: path, objs: objects{}}
	n := 0
	for _, doc := range splitYAML(data) {
		if !hasContent(doc) {
			continue
		}
		n++
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			d.skip(n, 0, err)
			continue
		}
		d.value(n, 0, js, nil)
	}
	return d.objs
}

func TestFastPathDecodesTheSameObjects(t *testing.T) {
	files := []string{
		string(scale.Manifest(4242, 10, 0)),
		webService + "---\n" + webSlice("10.0.0.1", "10.0.0.2"),
		"apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n1, labels: {a: b}}\n" +
			"- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n  spec: {type: NodePort, ports: [{port: 80, nodePort: 30080}]}\n",
	}
	log := slog.New(slog.DiscardHandler)
	for _, f := range files {
		fast, failures := decodeFile(log, source.NewCompactor(), "/m/f.yaml", []byte(f))
		slow := decodeThroughYAML(log, "/m/f.yaml", []byte(f))
		if failures != 0 || len(fast) == 0 || !sameObjects(fast, slow) {
			t.Errorf("file:\n%s\nfast path: %v (%d failures)\nyaml: %v", f, fast, failures, slow)
		}
	}
}
