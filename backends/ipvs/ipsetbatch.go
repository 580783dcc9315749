package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// batchBytes bounds the entries of one netlink message: far below the
// socket's send buffer, large enough for about 500 entries.
const batchBytes = 32 << 10

// setConn is the kernel's ipset interface: netlink.Handle for sets
// themselves, and an nfnetlink socket of its own that adds and deletes
// many entries per message (one IPSET_ATTR_ADT list, as `ipset restore`
// does), instead of netlink.Handle's one message and round trip per
// entry.
type setConn struct {
	*netlink.Handle
	sock *nl.SocketHandle
}

// newSetConn opens the nfnetlink socket in the network namespace fd (0:
// the caller's).
func newSetConn(h *netlink.Handle, fd int) (*setConn, error) {
	ns := vnetns.None()
	if fd != 0 {
		ns = vnetns.NsHandle(fd)
	}
	s, err := nl.GetNetlinkSocketAt(ns, vnetns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("ipvs: open nfnetlink socket: %w", err)
	}
	return &setConn{Handle: h, sock: &nl.SocketHandle{Socket: s}}, nil
}

// Close closes the nfnetlink socket (not the handle).
func (c *setConn) Close() { c.sock.Close() }

// IpsetDestroy destroys the set name, in place of netlink.Handle's: it
// asks with NLM_F_EXCL, without which the kernel (6.1 in the VM, 6.18
// here) answers success for a set that does not exist, so that a missing
// set fails with ENOENT and the cleanups can tell what they destroyed.
func (c *setConn) IpsetDestroy(name string) error {
	req := nl.NewNetlinkRequest(nl.IPSET_CMD_DESTROY|(unix.NFNL_SUBSYS_IPSET<<8), unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_EXCL)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: c.sock}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return ipsetErr(err)
}

// apply adds (or with del, deletes) entries of one set, as many per
// message as batchBytes allows. Adding a present entry and deleting a
// missing one succeed. A message stops at its first failing entry; the
// error names the set and that message's first entry.
func (c *setConn) apply(set string, del bool, es []setEntry) error {
	cmd := nl.IPSET_CMD_ADD
	if del {
		cmd = nl.IPSET_CMD_DEL
	}
	for len(es) > 0 {
		adt := nl.NewRtAttr(nl.IPSET_ATTR_ADT|unix.NLA_F_NESTED, nil)
		n, size := 0, 0
		for n < len(es) && size < batchBytes {
			data := entryData(es[n])
			size += data.Len()
			adt.AddChild(data)
			n++
		}
		req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), unix.NLM_F_REQUEST|unix.NLM_F_ACK)
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: c.sock}
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(set)))
		// The kernel wants a line number beside a list (ipset restore's);
		// with none in the entries, an error comes back as a plain errno.
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_LINENO, nl.Uint32Attr(0)))
		req.AddData(adt)
		if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil {
			verb := map[bool]string{false: "add", true: "delete"}[del]
			return fmt.Errorf("ipvs: %s %d entries from %s on, ipset %s: %w", verb, n, es[0].member(), set, ipsetErr(err))
		}
		es = es[n:]
	}
	return nil
}

// entryData encodes one entry as an IPSET_ATTR_DATA container.
func entryData(e setEntry) *nl.RtAttr {
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|unix.NLA_F_NESTED, nil)
	data.AddChild(ipAttr(nl.IPSET_ATTR_IP, e.addr.AsSlice()))
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PROTO, nl.Uint8Attr(uint8(protoNumber(e.proto)))))
	port := binary.BigEndian.AppendUint16(nil, e.port)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|unix.NLA_F_NET_BYTEORDER, port))
	if e.addr2.IsValid() {
		data.AddChild(ipAttr(nl.IPSET_ATTR_IP2, e.addr2.AsSlice()))
	}
	if e.bits2 > 0 {
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_CIDR2, nl.Uint8Attr(e.bits2)))
	}
	return data
}

// ipAttr is a nested address attribute of type t.
func ipAttr(t int, ip []byte) *nl.RtAttr {
	kind := nl.IPSET_ATTR_IPADDR_IPV4
	if len(ip) == 16 {
		kind = nl.IPSET_ATTR_IPADDR_IPV6
	}
	a := nl.NewRtAttr(t|unix.NLA_F_NESTED, nil)
	a.AddChild(nl.NewRtAttr(kind|unix.NLA_F_NET_BYTEORDER, ip))
	return a
}

// ipsetErr turns ipset's own error numbers into nl.IPSetError, which
// prints their meaning.
func ipsetErr(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		return nl.IPSetError(uintptr(errno))
	}
	return err
}
