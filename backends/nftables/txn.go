package nftables

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// opKind says what an op does to the kernel.
type opKind int

const (
	opAddTable opKind = iota
	opDelTable
	opAddChain
	opDelChain
	opAddRule
	opAddSet
	opDelSet
	opAddElems
	opDelElems
	opFlushSet
	opFlushChain
)

// op is one step of a transaction: recorded, it can be rendered as text
// (golden files) and given to the tests' kernel; the backend encodes it
// into the batch it sends as soon as it is made (see txn).
type op struct {
	kind  opKind
	chain *nftables.Chain
	set   *nftables.Set
	rule  *rule
	elems *elemList
	// tmpl, when set, stands for the rule: its encoding filled with args
	// (stickytmpl.go).
	tmpl *ruleTemplate
	args ruleArgs
	// comment is an added chain's comment; "" for none.
	comment string
}

// rule is a rule's expressions together with its nft-like text; ruleOf
// (fragments.go) makes them from the same matches.
type rule struct {
	text  string
	exprs []expr.Any
}

// txn collects the ops of one transaction. Built with a batch (out), it
// keeps none: each op is encoded into the batch as it is added, which is
// how the backend builds what it sends to the kernel. Without one it
// records them, for the tests' in-memory kernel and text renderings.
type txn struct {
	table *nftables.Table
	ops   []op
	out   *batch
	// n counts the ops added.
	n int
}

func (t *txn) add(o op) {
	t.n++
	if t.out != nil {
		t.out.op(t.table, o)
		return
	}
	t.ops = append(t.ops, o)
}

// addRule appends the rule the matches make to chain c.
func (t *txn) addRule(c *nftables.Chain, parts ...match) {
	t.add(op{kind: opAddRule, chain: c, rule: ruleOf(parts...)})
}

// elems appends the elements a list adds or deletes; nothing for none.
func (t *txn) elems(l *elemList) {
	if l != nil && l.n > 0 {
		kind := opAddElems
		if l.del {
			kind = opDelElems
		}
		t.add(op{kind: kind, set: &nftables.Set{Table: t.table, Name: l.set}, elems: l})
	}
}

// addElems appends elements added to set.
func (t *txn) addElems(set *nftables.Set, elems ...element) {
	t.elems(newElemList(t.table, set.Name, false).addAll(elems...))
}

// delElems appends elements deleted from set.
func (t *txn) delElems(set *nftables.Set, elems ...element) {
	t.elems(newElemList(t.table, set.Name, true).addAll(elems...))
}

// empty reports whether the transaction would change nothing.
func (t *txn) empty() bool { return t.n == 0 }

// String renders the recorded transaction in a form close to `nft -f`
// input, one element per line so golden-file diffs stay readable; the
// elements are decoded from the bytes the kernel would be sent. A
// transaction encoded as it was built records nothing to render.
func (t *txn) String() string {
	var b strings.Builder
	kw := "ip"
	if t.table.Family == nftables.TableFamilyIPv6 {
		kw = "ip6"
	}
	tbl := kw + " " + t.table.Name
	for _, o := range t.ops {
		switch o.kind {
		case opAddTable:
			fmt.Fprintf(&b, "add table %s\n", tbl)
		case opDelTable:
			fmt.Fprintf(&b, "delete table %s\n", tbl)
		case opAddChain:
			fmt.Fprintf(&b, "add chain %s %s%s%s\n", tbl, o.chain.Name, chainSpec(o.chain), chainComment(o.comment))
		case opDelChain:
			fmt.Fprintf(&b, "delete chain %s %s\n", tbl, o.chain.Name)
		case opAddRule:
			fmt.Fprintf(&b, "add rule %s %s %s\n", tbl, o.chain.Name, o.rule.text)
		case opAddSet:
			fmt.Fprintf(&b, "add %s %s %s { %s }\n", setWord(o.set), tbl, o.set.Name, setSpec(o.set))
		case opDelSet:
			fmt.Fprintf(&b, "delete %s %s %s\n", setWord(o.set), tbl, o.set.Name)
		case opFlushSet:
			fmt.Fprintf(&b, "flush %s %s %s\n", setWord(o.set), tbl, o.set.Name)
		case opFlushChain:
			fmt.Fprintf(&b, "flush chain %s %s\n", tbl, o.chain.Name)
		case opAddElems, opDelElems:
			verb := "add"
			if o.kind == opDelElems {
				verb = "delete"
			}
			for _, e := range o.elems.elements() {
				fmt.Fprintf(&b, "%s element %s %s { %s }\n", verb, tbl, o.set.Name, describe(addrLenOf(t.table), o.set.Name, e))
			}
		}
	}
	return b.String()
}

func chainSpec(c *nftables.Chain) string {
	if c.Hooknum == nil {
		return ""
	}
	hooks := map[nftables.ChainHook]string{
		*nftables.ChainHookPrerouting:  "prerouting",
		*nftables.ChainHookInput:       "input",
		*nftables.ChainHookForward:     "forward",
		*nftables.ChainHookOutput:      "output",
		*nftables.ChainHookPostrouting: "postrouting",
	}
	policy := ""
	switch {
	case c.Policy == nil:
	case *c.Policy == nftables.ChainPolicyAccept:
		policy = " policy accept;"
	case *c.Policy == nftables.ChainPolicyDrop:
		policy = " policy drop;"
	}
	return fmt.Sprintf(" { type %s hook %s priority %d;%s }", c.Type, hooks[*c.Hooknum], *c.Priority, policy)
}

// chainComment renders a chain's comment as nft reads it; "" for none.
func chainComment(comment string) string {
	if comment == "" {
		return ""
	}
	return fmt.Sprintf(" { comment %q; }", comment)
}

func setWord(s *nftables.Set) string {
	if s.IsMap {
		return "map"
	}
	return "set"
}

func setSpec(s *nftables.Set) string {
	spec := "type " + s.KeyType.Name
	if s.IsMap {
		spec += " : " + s.DataType.Name
	}
	if s.Interval {
		spec += "; flags interval"
	}
	if s.Dynamic && s.HasTimeout {
		spec += "; flags dynamic,timeout"
	}
	return spec + ";"
}
