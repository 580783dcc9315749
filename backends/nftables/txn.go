package nftables

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// maxElemsPerMessage keeps each NEWSETELEM/DELSETELEM attribute well under the
// 64 KiB netlink attribute limit: our largest element is ~60 bytes
// once encoded.
const maxElemsPerMessage = 700

// element is one set or map element, in the form the netlink library sends.
type element = nftables.SetElement

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

// op is one step of a transaction. Ops are collected first so the same list
// can be rendered as text (golden files, logs) and sent to the kernel.
type op struct {
	kind  opKind
	chain *nftables.Chain
	set   *nftables.Set
	rule  *rule
	elems []element
}

// rule is a rule's expressions together with its nft-like text; ruleOf
// (fragments.go) makes them from the same matches.
type rule struct {
	text  string
	exprs []expr.Any
}

// txn collects the ops of one transaction.
type txn struct {
	table *nftables.Table
	ops   []op
}

func (t *txn) add(o op) { t.ops = append(t.ops, o) }

// addRule appends the rule the matches make to chain c.
func (t *txn) addRule(c *nftables.Chain, parts ...match) {
	t.add(op{kind: opAddRule, chain: c, rule: ruleOf(parts...)})
}

func (t *txn) addElems(set *nftables.Set, elems ...element) {
	if len(elems) > 0 {
		t.add(op{kind: opAddElems, set: set, elems: elems})
	}
}

func (t *txn) delElems(set *nftables.Set, elems ...element) {
	if len(elems) > 0 {
		t.add(op{kind: opDelElems, set: set, elems: elems})
	}
}

// empty reports whether the transaction would change nothing.
func (t *txn) empty() bool { return len(t.ops) == 0 }

// String renders the transaction in a form close to `nft -f` input, one
// element per line so golden-file diffs stay readable.
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
			fmt.Fprintf(&b, "add chain %s %s%s\n", tbl, o.chain.Name, chainSpec(o.chain))
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
			for _, e := range o.elems {
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

// apply queues the transaction's ops on conn; the caller flushes them as one
// netlink batch, which the kernel commits atomically.
func (t *txn) apply(conn *nftables.Conn) error {
	for _, o := range t.ops {
		if err := applyOp(conn, t.table, o); err != nil {
			return err
		}
	}
	return nil
}

func applyOp(conn *nftables.Conn, table *nftables.Table, o op) error {
	switch o.kind {
	case opAddTable:
		conn.AddTable(table)
	case opDelTable:
		conn.DelTable(table)
	case opAddChain:
		conn.AddChain(o.chain)
	case opDelChain:
		conn.DelChain(o.chain)
	case opAddRule:
		conn.AddRule(&nftables.Rule{Table: table, Chain: o.chain, Exprs: o.rule.exprs})
	case opAddSet:
		return conn.AddSet(o.set, nil)
	case opDelSet:
		conn.DelSet(o.set)
	case opFlushSet:
		conn.FlushSet(o.set)
	case opFlushChain:
		conn.FlushChain(o.chain)
	case opAddElems, opDelElems:
		return applyElems(conn, o)
	}
	return nil
}

func applyElems(conn *nftables.Conn, o op) error {
	for start := 0; start < len(o.elems); start += maxElemsPerMessage {
		elems := o.elems[start:min(start+maxElemsPerMessage, len(o.elems))]
		var err error
		if o.kind == opAddElems {
			err = conn.SetAddElements(o.set, elems)
		} else {
			err = conn.SetDeleteElements(o.set, elems)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", o.set.Name, err)
		}
	}
	return nil
}
