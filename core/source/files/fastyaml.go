package files

import (
	"bytes"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// fastYAMLToJSON converts a YAML document to the JSON sigs.k8s.io/yaml's
// YAMLToJSON would produce, byte for byte, several times faster. It handles
// only the plain subset manifests are usually written in and declines
// (returns false) anything else, leaving it to YAMLToJSON:
//
//   - printable ASCII only, indented with spaces, no line breaks but "\n";
//   - block mappings whose keys are plain words starting with a letter, made
//     of letters, digits and "._/-", and appear once each;
//   - block sequences, including "- key: value" items and sequences at the
//     indentation of the key that holds them;
//   - flow sequences and mappings that close on the line they open on;
//   - scalars on one line: single- or double-quoted without escapes, or plain
//     ones that are text starting with a letter, "/" or "_", the YAML 1.1
//     booleans and null, decimal integers, or text starting with a digit that
//     yaml.v2 cannot read as a number or timestamp (IP addresses, UIDs);
//   - comments after a space, and lines holding only a comment.
//
// Anchors, aliases, tags, block scalars, multi-line scalars, floats, octal,
// and any other plain scalar whose meaning depends on YAML 1.1's resolution
// rules are declined. Parse errors are declined too, so YAMLToJSON reports
// them exactly as it always has.
func fastYAMLToJSON(doc []byte) ([]byte, bool) {
	var p yamlParser
	js, _, ok := p.convert(doc)
	return js, ok
}

// yamlParser converts documents as fastYAMLToJSON does, reusing its buffers
// from one document to the next. Every node's JSON is appended to buf as it
// is parsed and referred to by its span; collections then append their
// members again, mappings sorted by key as encoding/json sorts them.
type yamlParser struct {
	lines   []yamlLine
	pos     int // the next line to parse
	buf     []byte
	entries []mapEntry // the entries of the mappings being parsed
	items   []span     // the items of the sequences being parsed
	depth   int        // how many collections are being parsed
	header  span       // the root mapping's possible header entries
	failed  bool
}

// parsers holds idle parsers, so their buffers serve many documents.
var parsers = sync.Pool{New: func() any { return new(yamlParser) }}

// maxPooledBuffer bounds the buffer a pooled parser keeps.
const maxPooledBuffer = 1 << 20

// getParser returns an idle parser.
func getParser() *yamlParser {
	return parsers.Get().(*yamlParser)
}

// putParser makes p idle again, once nothing uses what it returned.
func putParser(p *yamlParser) {
	if cap(p.buf) <= maxPooledBuffer {
		parsers.Put(p)
	}
}

// convert converts doc as fastYAMLToJSON does. If doc is a mapping, it also
// returns a JSON object of only the root entries whose keys could match
// apiVersion, kind or items: decoding a manifest's header from it gives the
// same result as from the whole document, for far less work. Both are valid
// until the next call.
func (p *yamlParser) convert(doc []byte) (js, header []byte, ok bool) {
	p.pos, p.depth, p.header, p.failed = 0, 0, span{}, false
	p.buf, p.entries, p.items = p.buf[:0], p.entries[:0], p.items[:0]
	if !p.splitLines(doc) || len(p.lines) == 0 || p.lines[0].indent != 0 {
		return nil, nil, false
	}
	root := p.block(0, p.lines[0].text)
	if p.failed || p.pos != len(p.lines) {
		return nil, nil, false
	}
	if p.header != (span{}) {
		header = p.buf[p.header.start:p.header.end]
	}
	return p.buf[root.start:root.end], header, true
}

// yamlLine is one line with content, without its indentation and trailing spaces.
type yamlLine struct {
	indent int
	text   []byte
}

// span locates a node's JSON in the parser's buffer.
type span struct{ start, end int }

// mapEntry is one key of a mapping and the span of its value.
type mapEntry struct {
	key   []byte
	value span
}

// maxKeyLen is the longest key accepted; libyaml limits implicit keys to 1024
// characters.
const maxKeyLen = 1000

// splitLines records the lines that have content; it returns false if doc
// has a byte outside printable ASCII and "\n".
func (p *yamlParser) splitLines(doc []byte) bool {
	p.lines = p.lines[:0]
	for start := 0; start < len(doc); {
		end := start
		for end < len(doc) && doc[end] != '\n' {
			if c := doc[end]; c < ' ' || c > '~' {
				return false
			}
			end++
		}
		first, last := start, end
		for first < last && doc[first] == ' ' {
			first++
		}
		for last > first && doc[last-1] == ' ' {
			last--
		}
		if first < last && doc[first] != '#' {
			p.lines = append(p.lines, yamlLine{indent: first - start, text: doc[first:last]})
		}
		start = end + 1
	}
	return true
}

// decline gives up on the document.
func (p *yamlParser) decline() span {
	p.failed = true
	return span{}
}

// maxDepth bounds the nesting of collections, far below the 10,000 levels
// after which yaml.v2 fails.
const maxDepth = 100

// enter records that a collection starts, declining one nested too deep.
func (p *yamlParser) enter() {
	if p.depth++; p.depth > maxDepth {
		p.decline()
	}
}

// block parses the block node whose first line is the current one, where
// text starts at column col.
func (p *yamlParser) block(col int, text []byte) span {
	switch {
	case isItem(text):
		return p.sequence(col)
	case keyLen(text) > 0:
		return p.mapping(col, text)
	}
	return p.decline() // a scalar on a line of its own, or something else
}

// isItem reports whether text starts with a block sequence indicator.
func isItem(text []byte) bool {
	return len(text) > 0 && text[0] == '-' && (len(text) == 1 || text[1] == ' ')
}

// keyLen returns the length of the plain key text starts with, if it is
// followed by ": " or ends the line with ":"; otherwise it returns 0.
func keyLen(text []byte) int {
	if len(text) == 0 || !isLetter(text[0]) {
		return 0
	}
	n := 1
	for n < len(text) && n <= maxKeyLen && isWordByte(text[n]) {
		n++
	}
	if n > maxKeyLen || n == len(text) || text[n] != ':' || (n+1 < len(text) && text[n+1] != ' ') {
		return 0
	}
	if isSpecialWord(text[:n]) {
		return 0 // resolves to a boolean or null, which YAMLToJSON turns into text
	}
	return n
}

// mapping parses a block mapping whose keys sit at column col; text is the
// current line from its first key on.
func (p *yamlParser) mapping(col int, text []byte) span {
	base := len(p.entries)
	p.enter()
	defer func() { p.depth-- }()
	for !p.failed {
		n := keyLen(text)
		if n == 0 {
			return p.decline()
		}
		p.pos++
		value := p.value(col, bytes.TrimLeft(text[n+1:], " "), true)
		p.entries = append(p.entries, mapEntry{key: text[:n], value: value})
		if p.pos == len(p.lines) || p.lines[p.pos].indent < col {
			break
		}
		if p.lines[p.pos].indent > col {
			return p.decline()
		}
		text = p.lines[p.pos].text
	}
	return p.emitMapping(base)
}

// sequence parses a block sequence whose "-" indicators sit at column col,
// starting at the current line.
func (p *yamlParser) sequence(col int) span {
	base := len(p.items)
	p.enter()
	defer func() { p.depth-- }()
	for !p.failed && p.pos < len(p.lines) {
		line := p.lines[p.pos]
		if line.indent != col || !isItem(line.text) {
			break
		}
		rest := bytes.TrimLeft(line.text[1:], " ")
		itemCol := col + len(line.text) - len(rest)
		switch {
		case isItem(rest):
			return p.decline() // a compact nested sequence
		case keyLen(rest) > 0:
			item := p.mapping(itemCol, rest)
			p.items = append(p.items, item)
		default:
			p.pos++
			item := p.value(col, rest, false)
			p.items = append(p.items, item)
		}
	}
	return p.emitSequence(base)
}

// value parses the value of a mapping entry or sequence item whose line has
// been consumed: rest is what follows the key or indicator on that line, and
// col is the column of the mapping's keys or of the indicator. When rest is
// empty, the value is the block below, if any, or null. indentless allows a
// block sequence at column col, which only a mapping's value may be.
func (p *yamlParser) value(col int, rest []byte, indentless bool) span {
	if len(rest) > 0 && rest[0] != '#' {
		return p.inline(rest)
	}
	if p.pos < len(p.lines) {
		next := p.lines[p.pos]
		if next.indent > col || (indentless && next.indent == col && isItem(next.text)) {
			return p.block(next.indent, next.text)
		}
	}
	return p.literal("null")
}

// inline parses a node that must end on its line, followed at most by a comment.
func (p *yamlParser) inline(text []byte) span {
	var s span
	var n int
	switch text[0] {
	case '"', '\'':
		s, n = p.quoted(text)
	case '[', '{':
		s, n = p.flow(text, 0)
	default:
		return p.plain(text)
	}
	if rest := text[n:]; !p.failed && len(rest) > 0 {
		if rest[0] != ' ' || bytes.TrimLeft(rest, " ")[0] != '#' {
			return p.decline()
		}
	}
	return s
}

// plain parses a plain scalar in block context, up to a comment.
func (p *yamlParser) plain(text []byte) span {
	if i := bytes.Index(text, []byte(" #")); i >= 0 {
		text = bytes.TrimRight(text[:i], " ")
	}
	if bytes.Contains(text, []byte(": ")) || text[len(text)-1] == ':' {
		return p.decline() // a mapping where none may start
	}
	return p.scalar(text)
}

// quoted parses a single- or double-quoted scalar at the start of text and
// returns it with the length it takes up.
func (p *yamlParser) quoted(text []byte) (span, int) {
	q := text[0]
	end := bytes.IndexByte(text[1:], q) + 1
	switch {
	case end == 0:
		return p.decline(), 0 // continues on the next line
	case q == '"' && bytes.IndexByte(text[1:end], '\\') >= 0:
		return p.decline(), 0 // escape sequences
	case q == '\'' && end+1 < len(text) && text[end+1] == '\'':
		return p.decline(), 0 // an escaped quote
	}
	return p.str(text[1:end]), end + 1
}

// flow parses the flow sequence or mapping at text[i] and returns it with the
// index just past it.
func (p *yamlParser) flow(text []byte, i int) (span, int) {
	closer := byte(']')
	if text[i] == '{' {
		closer = '}'
	}
	entries, items := len(p.entries), len(p.items)
	p.enter()
	defer func() { p.depth-- }()
	i = skipSpaces(text, i+1)
	for !p.failed && at(text, i) != closer {
		var key []byte
		if closer == '}' {
			key, i = p.flowKey(text, i)
		}
		var item span
		item, i = p.flowNode(text, i)
		if closer == '}' {
			p.entries = append(p.entries, mapEntry{key: key, value: item})
		} else {
			p.items = append(p.items, item)
		}
		i = skipSpaces(text, i)
		switch at(text, i) {
		case ',':
			i = skipSpaces(text, i+1)
			if c := at(text, i); c == ']' || c == '}' {
				p.decline() // a trailing comma
			}
		case closer:
		default:
			p.decline()
		}
	}
	if p.failed {
		return span{}, 0
	}
	if closer == '}' {
		return p.emitMapping(entries), i + 1
	}
	return p.emitSequence(items), i + 1
}

// flowKey parses a plain key and the ": " after it in a flow mapping.
func (p *yamlParser) flowKey(text []byte, i int) ([]byte, int) {
	n := keyLen(text[i:])
	if n == 0 || i+n+1 >= len(text) {
		p.decline()
		return nil, i
	}
	return text[i : i+n], skipSpaces(text, i+n+1)
}

// flowNode parses a node inside a flow collection.
func (p *yamlParser) flowNode(text []byte, i int) (span, int) {
	switch at(text, i) {
	case '[', '{':
		return p.flow(text, i)
	case '"', '\'':
		s, n := p.quoted(text[i:])
		return s, i + n
	}
	j := i
	for j < len(text) && isWordByte(text[j]) {
		j++
	}
	if j == i {
		return p.decline(), i
	}
	return p.scalar(text[i:j]), j
}

// at returns text[i], or 0 past its end.
func at(text []byte, i int) byte {
	if i < len(text) {
		return text[i]
	}
	return 0
}

// skipSpaces returns the index of the first non-space at or after i.
func skipSpaces(text []byte, i int) int {
	for i < len(text) && text[i] == ' ' {
		i++
	}
	return i
}

// scalar appends the JSON for a plain scalar, resolved as yaml.v2 resolves
// it, or declines it if its resolution is not one of the simple cases.
func (p *yamlParser) scalar(v []byte) span {
	c := v[0]
	switch {
	case isLetter(c):
		switch string(v) {
		case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
			return p.literal("true")
		case "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
			return p.literal("false")
		case "null", "Null", "NULL":
			return p.literal("null")
		}
		return p.str(v)
	case c == '/' || c == '_':
		return p.str(v)
	case isDecimal(v):
		return p.literal(string(v))
	case isDotted(v) || (isDigit(c) && !mayBeNumber(string(v))):
		return p.str(v)
	}
	return p.decline()
}

// isSpecialWord reports whether a plain word resolves to a boolean or null.
func isSpecialWord(v []byte) bool {
	switch string(v) {
	case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
		"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
		"null", "Null", "NULL":
		return true
	}
	return false
}

// isDecimal reports whether v is a decimal integer without a leading zero
// that fits an int64: yaml.v2 reads those as ints, written back unchanged.
func isDecimal(v []byte) bool {
	return len(v) <= 18 && (len(v) == 1 || v[0] != '0') && allDigits(string(v))
}

// allDigits reports whether s is all decimal digits.
func allDigits(s string) bool {
	for i := range len(s) {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// isDotted reports whether v is digits with two or more dots, such as an IPv4
// address: no integer, float or timestamp, so yaml.v2 keeps it a string.
func isDotted(v []byte) bool {
	dots := 0
	for _, c := range v {
		switch {
		case c == '.':
			dots++
		case !isDigit(c):
			return false
		}
	}
	return dots >= 2
}

// yamlStyleFloat is the pattern yaml.v2 reads floats with.
var yamlStyleFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// mayBeNumber reports whether yaml.v2 could resolve a plain scalar that starts
// with a digit to something other than a string: a timestamp, an integer in
// any base or a float. It mirrors the checks of yaml.v2's resolve.
func mayBeNumber(s string) bool {
	if (len(s) > 4 && s[4] == '-' && allDigits(s[:4])) || strings.Contains(s, "_") {
		return true
	}
	if _, err := strconv.ParseInt(s, 0, 64); err == nil {
		return true
	}
	if _, err := strconv.ParseUint(s, 0, 64); err == nil {
		return true
	}
	return yamlStyleFloat.MatchString(s) || strings.HasPrefix(s, "0b")
}

func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }

// isWordByte reports whether c may appear in a plain key or flow scalar.
func isWordByte(c byte) bool {
	return isLetter(c) || isDigit(c) || c == '.' || c == '_' || c == '/' || c == '-'
}

// literal appends JSON text as is.
func (p *yamlParser) literal(js string) span {
	start := len(p.buf)
	p.buf = append(p.buf, js...)
	return span{start, len(p.buf)}
}

// str appends s as a JSON string, escaped as encoding/json escapes printable
// ASCII, including its HTML-safe escapes.
func (p *yamlParser) str(s []byte) span {
	start := len(p.buf)
	p.buf = appendJSONString(p.buf, s)
	return span{start, len(p.buf)}
}

// appendJSONString appends printable ASCII s to buf as a JSON string.
func appendJSONString(buf, s []byte) []byte {
	buf = append(buf, '"')
	for _, c := range s {
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '<', '>', '&':
			buf = append(buf, `\u00`...)
			buf = append(buf, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

// emitSequence appends a JSON array of the items from base on, and pops them.
func (p *yamlParser) emitSequence(base int) span {
	items := p.items[base:]
	p.items = p.items[:base]
	start := len(p.buf)
	p.buf = append(p.buf, '[')
	for i, item := range items {
		if i > 0 {
			p.buf = append(p.buf, ',')
		}
		p.buf = append(p.buf, p.buf[item.start:item.end]...)
	}
	p.buf = append(p.buf, ']')
	return span{start, len(p.buf)}
}

// emitMapping appends a JSON object of the entries from base on, sorted by
// key, and pops them; it declines a key that appears twice.
func (p *yamlParser) emitMapping(base int) span {
	entries := p.entries[base:]
	p.entries = p.entries[:base]
	slices.SortFunc(entries, func(a, b mapEntry) int { return bytes.Compare(a.key, b.key) })
	start := len(p.buf)
	p.buf = append(p.buf, '{')
	for i, e := range entries {
		if i > 0 {
			if bytes.Equal(e.key, entries[i-1].key) {
				return p.decline()
			}
			p.buf = append(p.buf, ',')
		}
		p.buf = appendJSONString(p.buf, e.key)
		p.buf = append(p.buf, ':')
		p.buf = append(p.buf, p.buf[e.value.start:e.value.end]...)
	}
	p.buf = append(p.buf, '}')
	s := span{start, len(p.buf)}
	if p.depth == 1 {
		p.header = p.emitHeader(entries)
	}
	return s
}

// emitHeader appends a JSON object of the sorted entries whose keys might
// match a field of header. encoding/json matches keys to fields ignoring
// ASCII case; this keeps, more broadly still, any key equal to apiVersion,
// kind or items once case, "-" and "_" are ignored. Decoding skips the values
// of other keys without looking at them, so leaving them out changes neither
// the header decoded nor any error.
func (p *yamlParser) emitHeader(entries []mapEntry) span {
	start := len(p.buf)
	p.buf = append(p.buf, '{')
	for _, e := range entries {
		if !mayBeHeaderKey(e.key) {
			continue
		}
		if len(p.buf) > start+1 {
			p.buf = append(p.buf, ',')
		}
		p.buf = appendJSONString(p.buf, e.key)
		p.buf = append(p.buf, ':')
		p.buf = append(p.buf, p.buf[e.value.start:e.value.end]...)
	}
	p.buf = append(p.buf, '}')
	return span{start, len(p.buf)}
}

// mayBeHeaderKey reports whether key is apiVersion, kind or items, ignoring
// ASCII case, "-" and "_".
func mayBeHeaderKey(key []byte) bool {
	var folded [len("apiversion")]byte
	n := 0
	for _, c := range key {
		switch {
		case c == '-' || c == '_':
			continue
		case n == len(folded):
			return false
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		}
		folded[n] = c
		n++
	}
	switch string(folded[:n]) {
	case "apiversion", "kind", "items":
		return true
	}
	return false
}
