package nftables

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// fakeKernel is an in-memory nf_tables that takes the backend's commits in
// place of netlink (the kernel interface): it applies each batch of
// transactions to a model of tables, chains, rules, sets, maps and
// elements, and dump shows the model in a stable text form. It refuses
// what the kernel refuses where the backend depends on the kernel's
// checks, with the kernel's errno: deleting a table, chain, set or element
// that does not exist (ENOENT), adding an element that exists with other
// data (EEXIST; with the same data it changes nothing, as without
// NLM_F_EXCL), overlapping intervals (EEXIST), deleting a chain something
// jumps to or a set a rule reads (EBUSY), a rule or element naming a
// missing chain or set (ENOENT), a rule reading a register it did not
// load (ENODATA) and keys or data of the wrong length (EINVAL). A batch
// applies all or nothing, and the generation counts the batches applied.
// TestKernelFakeAgrees checks these answers against the kernel's.
type fakeKernel struct {
	tables map[fakeTableID]*fakeTable
	gen    uint32
	// commits counts the batches applied, refused those refused, and
	// refusal is the latest refusal.
	commits, refused int
	refusal          error
	// failNext, when set, is what the next commit returns, changing
	// nothing: a netlink failure.
	failNext error
	// localnet is set once route_localnet was turned on.
	localnet bool
}

type fakeTableID struct {
	family nftables.TableFamily
	name   string
}

type fakeTable struct {
	fam    *family
	chains map[string]*fakeChain
	sets   map[string]*fakeSet
}

type fakeChain struct {
	def   nftables.Chain
	rules []*rule
	// comment is the one the chain was created with: as in the kernel,
	// adding the chain again does not change it.
	comment string
}

type fakeSet struct {
	def   nftables.Set
	elems map[string]element
}

var _ kernel = (*fakeKernel)(nil)

func newFakeKernel() *fakeKernel { return &fakeKernel{tables: map[fakeTableID]*fakeTable{}} }

func (k *fakeKernel) generation() (uint32, error) { return k.gen, nil }

// batch returns nil: the fake takes the transactions' recorded ops.
func (k *fakeKernel) batch() *batch { return nil }

func (k *fakeKernel) routeLocalnet() error {
	k.localnet = true
	return nil
}

func (k *fakeKernel) close() error { return nil }

// commit applies the transactions in order to a copy of the model, which
// replaces it only when every op succeeded.
func (k *fakeKernel) commit(txns []*txn) error {
	if err := k.failNext; err != nil {
		k.failNext = nil
		return k.refuse(err)
	}
	work := k.clone()
	for _, t := range txns {
		for i, o := range t.ops {
			if err := work.apply(t.table, o); err != nil {
				return k.refuse(fmt.Errorf("fake nf_tables: table %s %s, op %d: %w", famOf(t.table.Family).kw, t.table.Name, i+1, err))
			}
		}
	}
	k.tables = work.tables
	k.gen++
	k.commits++
	return nil
}

// refuse counts a refused commit and returns its error.
func (k *fakeKernel) refuse(err error) error {
	k.refused, k.refusal = k.refused+1, err
	return err
}

// change applies what another process does to the model: it counts as a
// commit of its own.
func (k *fakeKernel) change(fn func(k *fakeKernel)) {
	fn(k)
	k.gen++
}

func famOf(f nftables.TableFamily) *family {
	if f == nftables.TableFamilyIPv6 {
		return famV6
	}
	return famV4
}

// clone copies the model; rules and elements are never changed in place,
// so they are shared.
func (k *fakeKernel) clone() *fakeKernel {
	out := &fakeKernel{tables: map[fakeTableID]*fakeTable{}}
	for id, t := range k.tables {
		c := &fakeTable{fam: t.fam, chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
		for name, ch := range t.chains {
			c.chains[name] = &fakeChain{def: ch.def, rules: slices.Clone(ch.rules), comment: ch.comment}
		}
		for name, s := range t.sets {
			c.sets[name] = &fakeSet{def: s.def, elems: maps.Clone(s.elems)}
		}
		out.tables[id] = c
	}
	return out
}

func (k *fakeKernel) apply(tbl *nftables.Table, o op) error {
	id := fakeTableID{tbl.Family, tbl.Name}
	t := k.tables[id]
	switch {
	case o.kind == opAddTable:
		if t == nil {
			k.tables[id] = &fakeTable{fam: famOf(tbl.Family), chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
		}
		return nil
	case t == nil:
		return fmt.Errorf("no table: %w", unix.ENOENT)
	case o.kind == opDelTable:
		delete(k.tables, id)
		return nil
	}
	return t.apply(o)
}

func (t *fakeTable) apply(o op) error {
	switch o.kind {
	case opAddChain:
		return t.addChain(o.chain, o.comment)
	case opDelChain:
		return t.delChain(o.chain.Name)
	case opFlushChain:
		c, err := t.chain(o.chain.Name)
		if err == nil {
			c.rules = nil
		}
		return err
	case opAddRule:
		return t.addRule(o.chain.Name, o.rule)
	case opAddSet:
		return t.addSet(o.set)
	case opDelSet:
		return t.delSet(o.set.Name)
	case opFlushSet:
		s, err := t.set(o.set.Name)
		if err == nil {
			s.elems = map[string]element{}
		}
		return err
	case opAddElems:
		return t.addElems(o.set.Name, o.elems.elements())
	case opDelElems:
		return t.delElems(o.set.Name, o.elems.elements())
	}
	return fmt.Errorf("op kind %d: %w", o.kind, unix.EOPNOTSUPP)
}

func (t *fakeTable) chain(name string) (*fakeChain, error) {
	if c := t.chains[name]; c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("chain %s: %w", name, unix.ENOENT)
}

func (t *fakeTable) set(name string) (*fakeSet, error) {
	if s := t.sets[name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("set %s: %w", name, unix.ENOENT)
}

// addChain creates a chain with its comment, or updates one: a base chain
// keeps its type (EEXIST), hook and priority (EOPNOTSUPP), and only a base
// chain has a policy.
func (t *fakeTable) addChain(c *nftables.Chain, comment string) error {
	def := *c
	def.Table = nil
	old := t.chains[c.Name]
	switch {
	case c.Policy != nil && c.Hooknum == nil && (old == nil || old.def.Hooknum == nil):
		return fmt.Errorf("chain %s: a policy on a regular chain: %w", c.Name, unix.EOPNOTSUPP)
	case old == nil:
		t.chains[c.Name] = &fakeChain{def: def, comment: comment}
		return nil
	case c.Hooknum != nil && old.def.Hooknum != nil && old.def.Type != c.Type:
		return fmt.Errorf("chain %s: another type: %w", c.Name, unix.EEXIST)
	case c.Hooknum != nil && (old.def.Hooknum == nil || *old.def.Hooknum != *c.Hooknum || *old.def.Priority != *c.Priority):
		return fmt.Errorf("chain %s: another hook or priority: %w", c.Name, unix.EOPNOTSUPP)
	case c.Policy != nil:
		old.def.Policy = c.Policy
	}
	return nil
}

// delChain deletes a chain and its rules, unless a rule of another chain
// or a verdict map element sends packets to it.
func (t *fakeTable) delChain(name string) error {
	if _, err := t.chain(name); err != nil {
		return err
	}
	if by := t.chainUser(name); by != "" {
		return fmt.Errorf("chain %s is used by %s: %w", name, by, unix.EBUSY)
	}
	delete(t.chains, name)
	return nil
}

// chainUser names what jumps or goes to chain; "" for nothing.
func (t *fakeTable) chainUser(chain string) string {
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		for _, r := range t.chains[name].rules {
			for _, e := range r.exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Chain == chain && name != chain {
					return "a rule of chain " + name
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.sets)) {
		for _, e := range t.sets[name].elems {
			if e.verdict == chain {
				return "an element of " + name
			}
		}
	}
	return ""
}

// addRule appends a rule after checking its expressions as the kernel
// does when it receives them.
func (t *fakeTable) addRule(chain string, r *rule) error {
	c, err := t.chain(chain)
	if err != nil {
		return err
	}
	if err := t.checkRule(r.exprs); err != nil {
		return fmt.Errorf("rule %q in %s: %w", r.text, chain, err)
	}
	c.rules = append(c.rules, r)
	return nil
}

// checkRule checks the chains and sets a rule names and its registers:
// each expression reads only words an earlier one of the rule wrote.
func (t *fakeTable) checkRule(exprs []expr.Any) error {
	written := map[uint32]bool{}
	for i, e := range exprs {
		if err := t.checkRefs(e); err != nil {
			return err
		}
		reads, writes, err := exprRegisters(t.fam, e, t.shape)
		if err != nil {
			return fmt.Errorf("expression %d: %w: %w", i+1, err, unix.EINVAL)
		}
		for _, s := range reads {
			for w := s.word; w < s.word+s.n; w++ {
				if !written[w] {
					return fmt.Errorf("expression %d (%T) reads register word %d, which the rule did not load: %w", i+1, e, w, unix.ENODATA)
				}
			}
		}
		for _, s := range writes {
			for w := s.word; w < s.word+s.n; w++ {
				written[w] = true
			}
		}
	}
	return nil
}

// shape gives the key and data lengths of a set of the table.
func (t *fakeTable) shape(name string) (uint32, uint32, bool) {
	s := t.sets[name]
	if s == nil {
		return 0, 0, false
	}
	return s.def.KeyType.Bytes, s.def.DataType.Bytes, true
}

// checkRefs checks that the chain or set an expression names exists and
// suits it.
func (t *fakeTable) checkRefs(e expr.Any) error {
	switch x := e.(type) {
	case *expr.Verdict:
		if x.Kind == expr.VerdictJump || x.Kind == expr.VerdictGoto {
			return t.checkTarget(x.Chain)
		}
	case *expr.Lookup:
		s, err := t.set(x.SetName)
		switch {
		case err != nil:
			return err
		case x.IsDestRegSet && !s.def.IsMap:
			return fmt.Errorf("a lookup in %s stores a value, but it is a set: %w", x.SetName, unix.EINVAL)
		case x.IsDestRegSet && (s.def.DataType.Name == "verdict") != (x.DestRegister == regVerdict):
			return fmt.Errorf("a lookup in %s stores its value in register %d: %w", x.SetName, x.DestRegister, unix.EINVAL)
		}
	case *expr.Dynset:
		s, err := t.set(x.SetName)
		switch {
		case err != nil:
			return err
		case !s.def.Dynamic:
			return fmt.Errorf("an update of %s, which is not dynamic: %w", x.SetName, unix.EOPNOTSUPP)
		case x.Timeout > 0 && !s.def.HasTimeout:
			return fmt.Errorf("an update of %s with a timeout it has no flag for: %w", x.SetName, unix.EINVAL)
		}
	}
	return nil
}

// checkTarget checks that chain can be jumped or gone to.
func (t *fakeTable) checkTarget(chain string) error {
	c, err := t.chain(chain)
	if err == nil && c.def.Hooknum != nil {
		err = fmt.Errorf("a jump to base chain %s: %w", chain, unix.EOPNOTSUPP)
	}
	return err
}

// addSet creates a set, or does nothing when one of the same shape exists.
func (t *fakeTable) addSet(s *nftables.Set) error {
	def := *s
	def.Table = nil
	old := t.sets[s.Name]
	if old == nil {
		t.sets[s.Name] = &fakeSet{def: def, elems: map[string]element{}}
		return nil
	}
	if setShapeText(&old.def) != setShapeText(&def) {
		return fmt.Errorf("set %s exists as %s, not %s: %w", s.Name, setShapeText(&old.def), setShapeText(&def), unix.EEXIST)
	}
	return nil
}

func setShapeText(s *nftables.Set) string {
	return fmt.Sprintf("%s/%d map=%t %s/%d interval=%t concat=%t dynamic=%t timeout=%t", s.KeyType.Name, s.KeyType.Bytes,
		s.IsMap, s.DataType.Name, s.DataType.Bytes, s.Interval, s.Concatenation, s.Dynamic, s.HasTimeout)
}

// delSet deletes a set with its elements, unless a rule reads it.
func (t *fakeTable) delSet(name string) error {
	if _, err := t.set(name); err != nil {
		return err
	}
	for _, chain := range slices.Sorted(maps.Keys(t.chains)) {
		for _, r := range t.chains[chain].rules {
			if readsSet(r.exprs, name) {
				return fmt.Errorf("set %s is read by a rule of %s: %w", name, chain, unix.EBUSY)
			}
		}
	}
	delete(t.sets, name)
	return nil
}

// elemID is an element's identity in its set: its key, its range end and
// whether it ends an interval.
func elemID(e element) string {
	id := hex.EncodeToString(e.key) + "-" + hex.EncodeToString(e.keyEnd)
	if e.intervalEnd {
		id += "-end"
	}
	return id
}

// sameData reports whether two elements with one identity carry the same
// data, which makes adding the second a no-op.
func sameData(a, b element) bool {
	return a.verdict == b.verdict && bytes.Equal(a.val, b.val)
}

func (t *fakeTable) addElems(name string, elems []element) error {
	s, err := t.set(name)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if err := t.checkElem(s, e); err != nil {
			return fmt.Errorf("element %s of %s: %w", fakeDescribe(t.fam, name, e), name, err)
		}
		old, ok := s.elems[elemID(e)]
		switch {
		case !ok:
			s.elems[elemID(e)] = e
		case !sameData(old, e):
			return fmt.Errorf("element %s of %s exists with other data: %w", fakeDescribe(t.fam, name, e), name, unix.EEXIST)
		}
	}
	return s.checkIntervals(name)
}

// checkElem checks an element's lengths and the chain it goes to.
func (t *fakeTable) checkElem(s *fakeSet, e element) error {
	d := &s.def
	switch {
	case uint32(len(e.key)) != d.KeyType.Bytes || (e.keyEnd != nil && uint32(len(e.keyEnd)) != d.KeyType.Bytes):
		return fmt.Errorf("a key of %d bytes, not %d: %w", len(e.key), d.KeyType.Bytes, unix.EINVAL)
	case !d.Interval && (e.keyEnd != nil || e.intervalEnd):
		return fmt.Errorf("a range in a set without intervals: %w", unix.EINVAL)
	case !d.IsMap && (e.val != nil || e.verdict != ""):
		return fmt.Errorf("data in a set: %w", unix.EINVAL)
	case d.IsMap && d.DataType.Name == "verdict" && e.verdict == "" && !e.intervalEnd:
		return fmt.Errorf("no verdict: %w", unix.EINVAL)
	case d.IsMap && d.DataType.Name != "verdict" && uint32(len(e.val)) != d.DataType.Bytes && !e.intervalEnd:
		return fmt.Errorf("data of %d bytes, not %d: %w", len(e.val), d.DataType.Bytes, unix.EINVAL)
	case e.verdict != "":
		return t.checkTarget(e.verdict)
	}
	return nil
}

func (t *fakeTable) delElems(name string, elems []element) error {
	s, err := t.set(name)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if _, ok := s.elems[elemID(e)]; !ok {
			return fmt.Errorf("element %s of %s: %w", fakeDescribe(t.fam, name, e), name, unix.ENOENT)
		}
		delete(s.elems, elemID(e))
	}
	return nil
}

// checkIntervals refuses overlapping ranges in an interval set: a set of
// single fields holds a start element and an end element per range, one
// of concatenations each range's first and last key.
func (s *fakeSet) checkIntervals(name string) error {
	if !s.def.Interval {
		return nil
	}
	elems := slices.Collect(maps.Values(s.elems))
	if s.def.Concatenation {
		return concatOverlap(name, fieldSizes(s.def.KeyType), elems)
	}
	slices.SortFunc(elems, func(a, b element) int {
		// At one address, the end of a range comes before the next's start.
		return cmp.Or(bytes.Compare(a.key, b.key), -cmp.Compare(boolInt(a.intervalEnd), boolInt(b.intervalEnd)))
	})
	open := false
	for _, e := range elems {
		if e.intervalEnd != open {
			return fmt.Errorf("overlapping ranges in %s at %x: %w", name, e.key, unix.EEXIST)
		}
		open = !open
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fieldSizes returns the padded sizes of a concatenated type's fields.
func fieldSizes(t nftables.SetDatatype) []int {
	var out []int
	for _, f := range nftables.ConcatSetTypeElements(t) {
		out = append(out, int(wordsOf(f.Bytes)*4))
	}
	return out
}

// concatOverlap refuses two ranges of concatenations whose every field
// overlaps.
func concatOverlap(name string, sizes []int, elems []element) error {
	for i, a := range elems {
		for _, b := range elems[i+1:] {
			if rangesMeet(sizes, a, b) {
				return fmt.Errorf("overlapping ranges in %s: %x and %x: %w", name, a.key, b.key, unix.EEXIST)
			}
		}
	}
	return nil
}

func rangesMeet(sizes []int, a, b element) bool {
	end := func(e element) []byte {
		if e.keyEnd != nil {
			return e.keyEnd
		}
		return e.key
	}
	off := 0
	for _, n := range sizes {
		field := func(k []byte) []byte { return k[off : off+n] }
		if bytes.Compare(field(a.key), field(end(b))) > 0 || bytes.Compare(field(b.key), field(end(a))) > 0 {
			return false
		}
		off += n
	}
	return true
}

// fakeDescribe renders an element as the golden files do, or in hex when
// it is not one of Weir's.
func fakeDescribe(f *family, set string, e element) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("%x-%x", e.key, e.keyEnd)
		}
	}()
	return describe(int(f.addrLen), set, e)
}

// dump renders the model: tables, then each table's chains with their
// rules and its sets with their elements, sorted by name and elements by
// their text, indented by tabs. With raw set, each rule also shows a hash
// of its expressions and each element its bytes, so that two dumps are
// equal only when the models are.
func (k *fakeKernel) dump(raw bool) string {
	var b strings.Builder
	ids := slices.SortedFunc(maps.Keys(k.tables), func(a, b fakeTableID) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.name, b.name))
	})
	for _, id := range ids {
		t := k.tables[id]
		fmt.Fprintf(&b, "table %s %s\n", t.fam.kw, id.name)
		for _, name := range slices.Sorted(maps.Keys(t.chains)) {
			c := t.chains[name]
			fmt.Fprintf(&b, "\tchain %s%s%s\n", name, chainSpec(&c.def), chainComment(c.comment))
			for _, r := range c.rules {
				fmt.Fprintf(&b, "\t\t%s%s\n", r.text, rawRule(raw, id.family, r))
			}
		}
		for _, name := range slices.Sorted(maps.Keys(t.sets)) {
			s := t.sets[name]
			fmt.Fprintf(&b, "\t%s %s { %s }\n", setWord(&s.def), name, setSpec(&s.def))
			var lines []string
			for _, e := range s.elems {
				lines = append(lines, "\t\t"+fakeDescribe(t.fam, name, e)+rawElem(raw, e)+"\n")
			}
			slices.Sort(lines)
			b.WriteString(strings.Join(lines, ""))
		}
	}
	return b.String()
}

func rawRule(raw bool, fam nftables.TableFamily, r *rule) string {
	if !raw {
		return ""
	}
	sum := sha256.Sum256(ruleBytes(fam, r.exprs))
	return " # " + hex.EncodeToString(sum[:8])
}

func rawElem(raw bool, e element) string {
	if !raw {
		return ""
	}
	return fmt.Sprintf(" # %x %x %t %x %s %q", e.key, e.keyEnd, e.intervalEnd, e.val, e.verdict, e.comment)
}
