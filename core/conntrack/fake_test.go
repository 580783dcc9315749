package conntrack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// nla encodes a netlink attribute whose payload is the concatenation of
// parts, padded to 4 bytes.
func nla(typ uint16, parts ...[]byte) []byte {
	var p []byte
	for _, x := range parts {
		p = append(p, x...)
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(p)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, p...)
	return append(b, make([]byte, align4(len(b))-len(b))...)
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// tupleAttr encodes a CTA_TUPLE_* attribute as the kernel does.
func tupleAttr(typ uint16, proto uint8, src, dst netip.AddrPort) []byte {
	ipSrc, ipDst := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		ipSrc, ipDst = ctaIPv6Src, ctaIPv6Dst
	}
	return nla(typ|unix.NLA_F_NESTED,
		nla(ctaTupleIP|unix.NLA_F_NESTED, nla(ipSrc, src.Addr().AsSlice()), nla(ipDst, dst.Addr().AsSlice())),
		nla(ctaTupleProto|unix.NLA_F_NESTED, nla(ctaProtoNum, []byte{proto}),
			nla(ctaProtoSrcPort, be16(src.Port())), nla(ctaProtoDstPort, be16(dst.Port()))))
}

// fakeEntry is a conntrack entry as the fake kernel dumps it.
type fakeEntry struct {
	proto            uint8
	orig, replySrc   netip.AddrPort // replySrc: where the reply comes from
	origDst          netip.AddrPort
	zone             uint16
	id               uint32
	tcpState         uint8         // dumped in CTA_PROTOINFO when not 0
	errno            syscall.Errno // what deleting it answers
	errMsg           string        // extended-ack message with errno
	deleteAttributes []byte        // filled by the fake: what the delete carried
}

func (e *fakeEntry) family() uint8 {
	if e.orig.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// origAttr is the entry's CTA_TUPLE_ORIG.
func (e *fakeEntry) origAttr() []byte { return tupleAttr(ctaTupleOrig, e.proto, e.orig, e.origDst) }

// wantDelete is the payload a delete of the entry must carry after nfgenmsg.
func (e *fakeEntry) wantDelete() []byte {
	b := e.origAttr()
	if e.zone != 0 {
		b = append(b, nla(ctaZone, be16(e.zone))...)
	}
	return append(b, nla(ctaID, be32(e.id))...)
}

// payload is the entry's dump message after the netlink header.
func (e *fakeEntry) payload() []byte {
	b := []byte{e.family(), unix.NFNETLINK_V0, 0, 0}
	b = append(b, e.origAttr()...)
	b = append(b, tupleAttr(ctaTupleReply, e.proto, e.replySrc, e.orig)...)
	b = append(b, nla(3, be32(0x188))...) // CTA_STATUS
	b = append(b, nla(7, be32(30))...)    // CTA_TIMEOUT
	if e.tcpState != 0 {
		b = append(b, nla(ctaProtoInfo|unix.NLA_F_NESTED,
			nla(ctaProtoInfoTCP|unix.NLA_F_NESTED, nla(ctaProtoInfoTCPState, []byte{e.tcpState})))...)
	}
	if e.zone != 0 {
		b = append(b, nla(ctaZone, be16(e.zone))...)
	}
	return append(b, nla(ctaID, be32(e.id))...)
}

// errnoBytes is the error field of an NLMSG_ERROR: the negated errno.
func errnoBytes(e syscall.Errno) []byte {
	return binary.NativeEndian.AppendUint32(nil, uint32(-int32(e)))
}

// nlmsg frames a netlink message.
func nlmsg(typ, flags uint16, seq uint32, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(unix.NLMSG_HDRLEN+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, payload...)
	return append(b, make([]byte, align4(len(b))-len(b))...)
}

// fakeKernel answers ctnetlink dumps and deletes over a socket pair.
type fakeKernel struct {
	t       *testing.T
	entries []*fakeEntry
	perRead int           // dump messages per datagram
	dumpErr syscall.Errno // answer the dump with this error
	hang    bool          // never answer
	mayStop bool          // the reader may close mid-dump (Load's limit)

	mu      sync.Mutex
	dials   int
	dumps   int
	deletes int
	writes  int // datagrams of delete requests
	wg      sync.WaitGroup
}

// cleaner returns a Cleaner whose every Clear talks to k.
func (k *fakeKernel) cleaner() *Cleaner {
	c := &Cleaner{log: discard, nsFd: -1, dial: k.dial}
	k.t.Cleanup(k.wg.Wait)
	return c
}

func (k *fakeKernel) dial(int) (*conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.dials++
	k.mu.Unlock()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		defer unix.Close(fds[1])
		k.serve(fds[1])
	}()
	return newConn(fds[0])
}

// serve answers requests until the other end closes.
func (k *fakeKernel) serve(fd int) {
	buf := make([]byte, 1<<20)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n == 0 {
			return
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			k.t.Errorf("fake kernel: %v", err)
			return
		}
		if k.hang {
			continue
		}
		var acks []byte
		for _, m := range msgs {
			switch m.Header.Type {
			case msgCtGet:
				k.dump(fd, m)
			case msgCtDelete:
				acks = append(acks, k.delete(m)...)
			default:
				k.t.Errorf("fake kernel: unexpected message type %#x", m.Header.Type)
			}
		}
		if len(acks) > 0 {
			k.mu.Lock()
			k.writes++
			k.mu.Unlock()
			k.send(fd, acks)
		}
	}
}

// send writes one answer to the socket; a failed write fails the test.
func (k *fakeKernel) send(fd int, b []byte) {
	_, err := unix.Write(fd, b)
	if k.mayStop && (errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)) {
		return
	}
	if err != nil {
		k.t.Errorf("fake kernel: write an answer: %v", err)
	}
}

func (k *fakeKernel) dump(fd int, m syscall.NetlinkMessage) {
	k.mu.Lock()
	k.dumps++
	k.mu.Unlock()
	if m.Header.Flags != unix.NLM_F_REQUEST|unix.NLM_F_DUMP || len(m.Data) != nfgenLen || m.Data[0] != unix.AF_UNSPEC {
		k.t.Errorf("fake kernel: dump request flags %#x payload %x", m.Header.Flags, m.Data)
	}
	seq := m.Header.Seq
	if k.dumpErr != 0 {
		k.send(fd, nlmsg(unix.NLMSG_ERROR, 0, seq, append(errnoBytes(k.dumpErr), make([]byte, 16)...)))
		return
	}
	// A late answer to an earlier request comes first; it must be ignored.
	k.send(fd, nlmsg(unix.NFNL_SUBSYS_CTNETLINK<<8, unix.NLM_F_MULTI, seq-1, k.entries[0].payload()))
	var out []byte
	for i, e := range k.entries {
		out = append(out, nlmsg(unix.NFNL_SUBSYS_CTNETLINK<<8, unix.NLM_F_MULTI, seq, e.payload())...)
		if (i+1)%max(k.perRead, 1) == 0 {
			k.send(fd, out)
			out = nil
		}
	}
	k.send(fd, append(out, nlmsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, seq, make([]byte, 4))...))
}

// delete finds the entry a delete request names and returns its ack.
func (k *fakeKernel) delete(m syscall.NetlinkMessage) []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deletes++
	if m.Header.Flags != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
		k.t.Errorf("fake kernel: delete flags %#x", m.Header.Flags)
	}
	errno, text := unix.ENOENT, ""
	for _, e := range k.entries {
		if e.family() == m.Data[0] && bytes.Equal(e.wantDelete(), m.Data[nfgenLen:]) {
			if e.deleteAttributes != nil {
				k.t.Errorf("fake kernel: entry %d deleted twice", e.id)
			}
			e.deleteAttributes = m.Data[nfgenLen:]
			errno, text = e.errno, e.errMsg
			break
		}
	}
	hdr := nlmsg(m.Header.Type, m.Header.Flags, m.Header.Seq, nil)[:unix.NLMSG_HDRLEN]
	binary.NativeEndian.PutUint32(hdr, m.Header.Len)
	payload := append(errnoBytes(errno), hdr...)
	var flags uint16
	if text != "" {
		flags = unix.NLM_F_CAPPED | unix.NLM_F_ACK_TLVS
		payload = append(payload, nla(unix.NLMSGERR_ATTR_MSG, append([]byte(text), 0))...)
	}
	return nlmsg(unix.NLMSG_ERROR, flags, m.Header.Seq, payload)
}
