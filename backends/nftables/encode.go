package nftables

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// batch is one netlink batch: the messages of a commit's ops in order, as
// pieces the kernel is sent without their being copied together. Element
// lists are pieces of their own; the other ops' messages go into streams
// of the batch's. The first encoding error sticks (err). Messages ask for
// no acknowledgement: kernel.go asks for one on the last when it sends.
type batch struct {
	pieces []*stream
	// objs takes the object messages; nil after an element list.
	objs *stream
	// setID numbers the sets the batch adds, as the netlink library did.
	setID uint32
	err   error
}

// op appends the messages of o on table t.
func (b *batch) op(t *nftables.Table, o op) {
	if o.kind == opAddElems || o.kind == opDelElems {
		o.elems.finish()
		b.pieces = append(b.pieces, &o.elems.s)
		b.objs = nil
		return
	}
	if b.objs == nil {
		b.objs = &stream{}
		b.pieces = append(b.pieces, b.objs)
	}
	s, fam := b.objs, byte(t.Family)
	switch o.kind {
	case opAddTable, opDelTable:
		typ, flags := uint16(unix.NFT_MSG_NEWTABLE), uint16(unix.NLM_F_CREATE)
		if o.kind == opDelTable {
			typ, flags = unix.NFT_MSG_DELTABLE, 0
		}
		m := s.begin(typ, flags, fam)
		s.str(unix.NFTA_TABLE_NAME, t.Name)
		s.u32(unix.NFTA_TABLE_FLAGS, 0)
		s.end(m)
	case opAddChain:
		encodeChain(s, fam, t, o.chain, o.comment)
	case opDelChain:
		named(s, unix.NFT_MSG_DELCHAIN, fam, t, unix.NFTA_CHAIN_NAME, o.chain.Name)
	case opFlushChain:
		named(s, unix.NFT_MSG_DELRULE, fam, t, unix.NFTA_RULE_CHAIN, o.chain.Name)
	case opAddRule:
		b.rule(s, fam, t, o)
	case opAddSet:
		b.setID++
		encodeSet(s, fam, t, o.set, b.setID)
	case opDelSet:
		named(s, unix.NFT_MSG_DELSET, fam, t, unix.NFTA_SET_NAME, o.set.Name)
	case opFlushSet:
		named(s, unix.NFT_MSG_DELSETELEM, fam, t, unix.NFTA_SET_ELEM_LIST_SET, o.set.Name)
	}
}

// named writes a message naming an object of table t in attribute attr;
// the table is attribute 1 of chains, rules, sets and element lists alike.
func named(s *stream, typ uint16, fam byte, t *nftables.Table, attr uint16, name string) {
	m := s.begin(typ, 0, fam)
	s.str(unix.NFTA_TABLE_NAME, t.Name)
	s.str(attr, name)
	s.end(m)
}

// encodeChain writes a chain as the netlink library's AddChain does, and
// its comment, which the library cannot write, as the nft tool does.
func encodeChain(s *stream, fam byte, t *nftables.Table, c *nftables.Chain, comment string) {
	m := s.begin(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, fam)
	s.str(unix.NFTA_CHAIN_TABLE, t.Name)
	s.str(unix.NFTA_CHAIN_NAME, c.Name)
	if c.Hooknum != nil && c.Priority != nil {
		h := s.nest(unix.NFTA_CHAIN_HOOK)
		s.u32(unix.NFTA_HOOK_HOOKNUM, uint32(*c.Hooknum))
		s.u32(unix.NFTA_HOOK_PRIORITY, uint32(*c.Priority))
		s.close(h)
	}
	if c.Policy != nil {
		s.u32(unix.NFTA_CHAIN_POLICY, uint32(*c.Policy))
	}
	if c.Type != "" {
		s.str(unix.NFTA_CHAIN_TYPE, string(c.Type))
	}
	if comment != "" {
		s.attr(nftaChainUserdata, userdata.AppendString(nil, nftnlUdataChainComment, comment))
	}
	s.end(m)
}

// nftaChainUserdata is NFTA_CHAIN_USERDATA, a chain's user data, and
// nftnlUdataChainComment is NFTNL_UDATA_CHAIN_COMMENT, the type of the
// comment in it (libnftnl's udata.h).
const (
	nftaChainUserdata                    = 12
	nftnlUdataChainComment userdata.Type = 0
)

// rule writes a rule appended to its chain; its expressions are encoded by
// the netlink library.
func (b *batch) rule(s *stream, fam byte, t *nftables.Table, o op) {
	m := s.begin(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, fam)
	s.str(unix.NFTA_RULE_TABLE, t.Name)
	s.str(unix.NFTA_RULE_CHAIN, o.chain.Name)
	list := s.nest(unix.NFTA_RULE_EXPRESSIONS)
	if o.tmpl != nil {
		s.template(o.tmpl, &o.args)
	} else {
		for _, e := range o.rule.exprs {
			data, err := expr.Marshal(fam, e)
			if err != nil && b.err == nil {
				b.err = fmt.Errorf("rule %q in chain %s: %w", o.rule.text, o.chain.Name, err)
			}
			s.attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
		}
	}
	s.close(list)
	s.end(m)
}

// encodeSet writes a set as the netlink library's AddSet does, for the
// kinds of sets Weir makes (TestEncodingMatchesTheLibrary compares them).
func encodeSet(s *stream, fam byte, t *nftables.Table, set *nftables.Set, id uint32) {
	m := s.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, fam)
	s.str(unix.NFTA_SET_TABLE, t.Name)
	s.str(unix.NFTA_SET_NAME, set.Name)
	s.u32(unix.NFTA_SET_FLAGS, setFlags(set))
	s.u32(unix.NFTA_SET_KEY_TYPE, set.KeyType.GetNFTMagic())
	s.u32(unix.NFTA_SET_KEY_LEN, set.KeyType.Bytes)
	s.u32(unix.NFTA_SET_ID, id)
	if set.IsMap {
		dataType := set.DataType.GetNFTMagic()
		if dataType == nftables.TypeVerdict.GetNFTMagic() {
			dataType = unix.NFT_DATA_VERDICT
		}
		s.u32(unix.NFTA_SET_DATA_TYPE, dataType)
		s.u32(unix.NFTA_SET_DATA_LEN, set.DataType.Bytes)
	}
	if set.Size > 0 || set.Concatenation {
		desc := s.nest(unix.NFTA_SET_DESC)
		if set.Size > 0 {
			s.u32(unix.NFTA_SET_DESC_SIZE, set.Size)
		}
		if set.Concatenation {
			concat := s.nest(nftables.NFTA_SET_DESC_CONCAT)
			for _, f := range nftables.ConcatSetTypeElements(set.KeyType) {
				// A field's length in a list element, not flagged nested,
				// as the library writes it.
				field := appendAttrHeader(nil, attrHeaderLen+4, nftaSetFieldLen)
				s.attr(unix.NFTA_LIST_ELEM, binary.BigEndian.AppendUint32(field, f.Bytes))
			}
			s.close(concat)
		}
		s.close(desc)
	}
	if set.Interval {
		s.attr(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 2))
	}
	s.end(m)
}

// nftaSetFieldLen is NFTA_SET_FIELD_LEN, a field's length in a set's
// description.
const nftaSetFieldLen = 1

func setFlags(set *nftables.Set) uint32 {
	var flags uint32
	for _, f := range []struct {
		on   bool
		flag uint32
	}{
		{set.Interval, unix.NFT_SET_INTERVAL}, {set.IsMap, unix.NFT_SET_MAP}, {set.HasTimeout, unix.NFT_SET_TIMEOUT},
		{set.Dynamic, unix.NFT_SET_EVAL}, {set.Concatenation, nftables.NFT_SET_CONCAT},
	} {
		if f.on {
			flags |= f.flag
		}
	}
	return flags
}
