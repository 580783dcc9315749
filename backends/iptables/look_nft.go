package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// An iptables-nft table, read over nftables netlink the way nft lists it:
// one dump of the family's chains (NFT_MSG_GETCHAIN) gives every chain
// with its use (rules plus jumps to it) and whether it is a base chain (a
// hook attribute); then one dump per base chain of its rules
// (NFT_MSG_GETRULE filtered by table and chain), whose expressions say
// where each jumps (an immediate verdict), with which comment
// (iptables-nft keeps -m comment as an xt match) and whether it matches
// connection states (a ct expression).

// Netlink and nf_tables numbers (linux/netfilter/nf_tables.h).
const (
	nftSubsys      = 10 << 8 // NFNL_SUBSYS_NFTABLES
	nftGetChain    = 4
	nftNewChain    = 3
	nftGetRule     = 7
	nftNewRule     = 6
	nlHeaderLen    = 16
	nfgenHeaderLen = 4

	attrTableOfChain = 1 // NFTA_CHAIN_TABLE
	attrChainName    = 3 // NFTA_CHAIN_NAME
	attrChainHook    = 4 // NFTA_CHAIN_HOOK
	attrChainUse     = 6 // NFTA_CHAIN_USE
	attrTableOfRule  = 1 // NFTA_RULE_TABLE
	attrRuleChain    = 2 // NFTA_RULE_CHAIN
	attrRuleExprs    = 4 // NFTA_RULE_EXPRESSIONS
	attrListElem     = 1 // NFTA_LIST_ELEM
	attrExprName     = 1 // NFTA_EXPR_NAME
	attrExprData     = 2 // NFTA_EXPR_DATA
	attrImmData      = 2 // NFTA_IMMEDIATE_DATA
	attrDataVerdict  = 2 // NFTA_DATA_VERDICT
	attrVerdictCode  = 1 // NFTA_VERDICT_CODE
	attrVerdictChain = 2 // NFTA_VERDICT_CHAIN
	attrMatchName    = 1 // NFTA_MATCH_NAME
	attrMatchInfo    = 3 // NFTA_MATCH_INFO

	verdictJump = -3 // NFT_JUMP
	verdictGoto = -4 // NFT_GOTO
)

// lookNFT reads the iptables-nft tables of family f inside netNS, keyed
// by name: one dump of the family's chains for all of them. A table that
// is not there looks empty.
func lookNFT(netNS int, f ipFamily, tables []string) (map[string]*tableLook, error) {
	family := uint8(unix.NFPROTO_IPV4)
	if f == ipv6 {
		family = unix.NFPROTO_IPV6
	}
	looks := map[string]*tableLook{}
	for _, t := range tables {
		looks[t] = newTableLook(true)
	}
	err := inNetNS(netNS, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		defer unix.Close(fd)
		c := &nlDump{fd: fd, buf: make([]byte, 64<<10)}
		base := map[string][]string{}
		err = c.dump(nftGetChain, family, nil, func(msgType uint16, attrs []byte) {
			if msgType != nftSubsys|nftNewChain {
				return
			}
			table := attrString(attrs, attrTableOfChain)
			l := looks[string(table)]
			if l == nil {
				return
			}
			name := string(attrString(attrs, attrChainName))
			if use := attrGet(attrs, attrChainUse); len(use) == 4 {
				l.counts[name] = int(binary.BigEndian.Uint32(use))
			}
			if attrGet(attrs, attrChainHook) != nil {
				base[string(table)] = append(base[string(table)], name)
			}
		})
		if err != nil {
			return fmt.Errorf("list chains: %w", err)
		}
		for _, table := range tables {
			for _, chain := range base[table] {
				if err := c.baseRules(family, table, chain, looks[table]); err != nil {
					return fmt.Errorf("list rules of %s chain %s: %w", table, chain, err)
				}
			}
		}
		return nil
	})
	return looks, err
}

// baseRules dumps the rules of one base chain into l: the jumps to other
// chains and those of them that are jump rules with a comment.
func (c *nlDump) baseRules(family uint8, table, chain string, l *tableLook) error {
	filter := appendAttr(appendAttr(nil, attrTableOfRule, append([]byte(table), 0)), attrRuleChain, append([]byte(chain), 0))
	return c.dump(nftGetRule, family, filter, func(msgType uint16, attrs []byte) {
		if msgType != nftSubsys|nftNewRule {
			return
		}
		j := ruleJump(attrGet(attrs, attrRuleExprs))
		if j.to == "" {
			return
		}
		l.baseRefs[j.to]++
		if j.comment != "" {
			j.table, j.from = table, chain
			l.jumps[j] = true
		}
	})
}

// ruleJump reads a rule's expressions: the chain it jumps or goes to, its
// comment and whether it matches connection states.
func ruleJump(exprs []byte) (j jump) {
	eachAttr(exprs, func(typ uint16, elem []byte) {
		if typ != attrListElem {
			return
		}
		data := attrGet(elem, attrExprData)
		switch string(attrString(elem, attrExprName)) {
		case "immediate":
			verdict := attrGet(attrGet(data, attrImmData), attrDataVerdict)
			if v := attrGet(verdict, attrVerdictCode); len(v) == 4 {
				if code := int32(binary.BigEndian.Uint32(v)); code == verdictJump || code == verdictGoto {
					j.to = string(attrString(verdict, attrVerdictChain))
				}
			}
		case "match":
			switch string(attrString(data, attrMatchName)) {
			case "comment":
				j.comment = cstring(attrGet(data, attrMatchInfo))
			case "conntrack", "state":
				j.newOnly = true
			}
		case "ct":
			j.newOnly = true
		}
	})
	return j
}

// nlDump runs nf_tables netlink requests and dumps on one socket, one at
// a time.
type nlDump struct {
	fd  int
	seq uint32
	buf []byte
}

// dump sends an nf_tables dump request for msg in family, with attrs,
// and calls fn with the type and attributes of every message of the
// answer.
func (c *nlDump) dump(msg uint16, family uint8, attrs []byte, fn func(msgType uint16, attrs []byte)) error {
	return c.exchange(msg, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, family, attrs, fn)
}

// request sends an nf_tables request for msg in family, asking for an
// acknowledgement, and calls fn with the type and attributes of every
// message of the answer.
func (c *nlDump) request(msg uint16, family uint8, fn func(msgType uint16, attrs []byte)) error {
	return c.exchange(msg, unix.NLM_F_REQUEST|unix.NLM_F_ACK, family, nil, fn)
}

// exchange sends one request and reads its answer up to NLMSG_DONE or the
// acknowledgement.
func (c *nlDump) exchange(msg, flags uint16, family uint8, attrs []byte, fn func(msgType uint16, attrs []byte)) error {
	c.seq++
	req := make([]byte, nlHeaderLen+nfgenHeaderLen, nlHeaderLen+nfgenHeaderLen+len(attrs))
	req = append(req, attrs...)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], nftSubsys|msg)
	ne.PutUint16(req[6:], flags)
	ne.PutUint32(req[8:], c.seq)
	req[16] = family
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		done, err := c.messages(c.buf[:n], fn)
		if done || err != nil {
			return err
		}
	}
}

// messages handles the messages of one read; done is set at the end of
// the dump.
func (c *nlDump) messages(b []byte, fn func(uint16, []byte)) (done bool, err error) {
	ne := binary.NativeEndian
	for len(b) >= nlHeaderLen {
		size := int(ne.Uint32(b))
		if size < nlHeaderLen || size > len(b) {
			return false, errors.New("netlink: truncated message")
		}
		msg, typ := b[:size], ne.Uint16(b[4:])
		b = b[min(nlAlign(size), len(b)):]
		if ne.Uint32(msg[8:]) != c.seq {
			continue
		}
		switch typ {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(msg) >= nlHeaderLen+4 {
				if code := int32(ne.Uint32(msg[nlHeaderLen:])); code != 0 {
					if unix.Errno(-code) == unix.ENOENT {
						return true, nil
					}
					return true, unix.Errno(-code)
				}
			}
			return true, nil
		}
		if len(msg) >= nlHeaderLen+nfgenHeaderLen {
			fn(typ, msg[nlHeaderLen+nfgenHeaderLen:])
		}
	}
	return false, nil
}

// nlAlign rounds n up to netlink's 4-byte alignment.
func nlAlign(n int) int { return (n + 3) &^ 3 }

// eachAttr calls fn with the type (flags cleared) and payload of every
// attribute in b.
func eachAttr(b []byte, fn func(typ uint16, payload []byte)) {
	ne := binary.NativeEndian
	for len(b) >= 4 {
		size := int(ne.Uint16(b))
		if size < 4 || size > len(b) {
			return
		}
		fn(ne.Uint16(b[2:])&0x3fff, b[4:size])
		b = b[min(nlAlign(size), len(b)):]
	}
}

// attrGet returns the payload of the first attribute of type typ in b, or
// nil.
func attrGet(b []byte, typ uint16) []byte {
	ne := binary.NativeEndian
	for len(b) >= 4 {
		size := int(ne.Uint16(b))
		if size < 4 || size > len(b) {
			return nil
		}
		if ne.Uint16(b[2:])&0x3fff == typ {
			return b[4:size]
		}
		b = b[min(nlAlign(size), len(b)):]
	}
	return nil
}

// attrString returns a string attribute without its NUL.
func attrString(b []byte, typ uint16) []byte {
	v := attrGet(b, typ)
	for len(v) > 0 && v[len(v)-1] == 0 {
		v = v[:len(v)-1]
	}
	return v
}

// appendAttr appends one attribute to b.
func appendAttr(b []byte, typ uint16, payload []byte) []byte {
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(4+len(payload)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b = append(append(b, h[:]...), payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
