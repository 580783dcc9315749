package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Listing a hash set walks it from its start for every part of the dump
// the kernel sends (nft_rhash_walk skips what it sent before), so listing an
// endpoints-W map of 100k buckets took 3-8 s, and the time grows with the
// square of the size. ReadBack lists the small maps and asks for the
// buckets the pick chains can draw by key instead: one lookup each, as the
// datapath does.

// bucketWindow bounds the requests in flight, so that the answers fit the
// socket's receive buffer.
const bucketWindow = 1024

// pickMaps are the verdict maps whose entries go to pick chains.
var pickMaps = [...]string{setServiceIPs, setNodePorts, setShortIPs, setShortNodePorts}

// bucketKeys returns, per endpoints map present, the key of every bucket
// the verdict maps' entries can draw: the entry's key . 0 to W-1 for the
// weight W its pick chain's name stands for.
func (d *tableDump) bucketKeys() map[string][][]byte {
	out := map[string][][]byte{}
	for _, vmap := range pickMaps {
		for _, e := range d.elems[vmap] {
			chain, _ := gotoChain(e.Val)
			spec, ok := parsePickChain(chain)
			name := mapID{lane: spec.kind.lane(), weight: spec.weight}.name()
			if !ok || d.sets[name] == nil {
				continue
			}
			for b := range spec.weight {
				out[name] = append(out[name], bucketKey(e.Key, b))
			}
		}
	}
	return out
}

// readBuckets asks for the buckets the verdict maps can draw and adds
// those the endpoints maps hold to the dump.
func (d *tableDump) readBuckets(c *netlink.Conn, table *nftables.Table) error {
	buf := make([]byte, 64<<10) // an answer is one small message
	for name, keys := range d.bucketKeys() {
		for start := 0; start < len(keys); start += bucketWindow {
			elems, err := getElements(c, buf, table, name, keys[start:min(start+bucketWindow, len(keys))])
			if err != nil {
				return fmt.Errorf("look up buckets in %s: %w", name, err)
			}
			d.elems[name] = append(d.elems[name], elems...)
		}
	}
	return nil
}

// getElements asks for the element of each key in one write, a request
// per key, and returns those set holds: each request is answered by the
// element or by an error (ENOENT when there is none). It reads into buf.
func getElements(c *netlink.Conn, buf []byte, table *nftables.Table, set string, keys [][]byte) ([]nftables.SetElement, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	attrs, err := elementRequest(table.Name, set, keys[0])
	if err != nil {
		return nil, err
	}
	template := append([]byte{byte(table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...)
	reqs := make([]netlink.Message, len(keys))
	for i, k := range keys {
		if len(k) != len(keys[0]) {
			return nil, fmt.Errorf("keys of %d and %d bytes", len(keys[0]), len(k))
		}
		// The key is the request's last attribute, 4-byte aligned: each
		// request is the first with its key in place.
		data := slices.Clone(template)
		copy(data[len(data)-len(k):], k)
		reqs[i] = netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request},
			Data:   data,
		}
	}
	sent, err := c.SendMessages(reqs)
	if err != nil {
		return nil, err
	}
	pending := make(map[uint32]bool, len(sent))
	for _, m := range sent {
		pending[m.Header.Sequence] = true
	}
	var out []nftables.SetElement
	for len(pending) > 0 {
		msgs, err := receiveRaw(c, buf)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if !pending[m.Header.Seq] {
				continue
			}
			delete(pending, m.Header.Seq)
			e, err := answeredElement(m)
			if err != nil {
				return nil, err
			}
			if e != nil {
				out = append(out, *e)
			}
		}
	}
	return out, nil
}

// elementRequest encodes the attributes of a request for one element.
func elementRequest(table, set string, key []byte) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	return ae.Encode()
}

// receiveRaw reads the next datagram into buf and parses its messages.
// (The netlink library drops every message of a read that holds an error,
// and here errors, ENOENT, answer some requests among the others.)
func receiveRaw(c *netlink.Conn, buf []byte) ([]syscall.NetlinkMessage, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err := errors.Join(err, rerr); err != nil {
		return nil, err
	}
	return syscall.ParseNetlinkMessage(buf[:n])
}

// answeredElement decodes the answer to an element request: the element,
// nil when the set has none with that key, or the error.
func answeredElement(m syscall.NetlinkMessage) (*nftables.SetElement, error) {
	if m.Header.Type == unix.NLMSG_ERROR {
		if len(m.Data) < 4 {
			return nil, errors.New("short netlink error message")
		}
		switch errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data))); errno {
		case 0, unix.ENOENT:
			return nil, nil
		default:
			return nil, errno
		}
	}
	if len(m.Data) < 4 {
		return nil, errors.New("short element message")
	}
	return decodeElementList(m.Data[4:])
}

// decodeElementList decodes the first element of a NEWSETELEM message's
// attributes: its key and its data.
func decodeElementList(b []byte) (*nftables.SetElement, error) {
	var e *nftables.SetElement
	err := eachAttr(b, func(typ uint16, data []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return eachAttr(data, func(_ uint16, elem []byte) error {
			if e != nil {
				return nil
			}
			e = &nftables.SetElement{}
			return eachAttr(elem, func(typ uint16, v []byte) error {
				var err error
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					e.Key, err = dataValue(v)
				case unix.NFTA_SET_ELEM_DATA:
					e.Val, err = dataValue(v)
				}
				return err
			})
		})
	})
	if err == nil && e == nil {
		err = errors.New("element message without an element")
	}
	return e, err
}

// dataValue returns the NFTA_DATA_VALUE inside a nested data attribute.
func dataValue(b []byte) ([]byte, error) {
	var out []byte
	err := eachAttr(b, func(typ uint16, v []byte) error {
		if typ == unix.NFTA_DATA_VALUE {
			out = v
		}
		return nil
	})
	return out, err
}

func eachAttr(b []byte, fn func(typ uint16, data []byte) error) error {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err
	}
	for ad.Next() {
		if err := fn(ad.Type(), ad.Bytes()); err != nil {
			return err
		}
	}
	return ad.Err()
}
