package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// maxIovecs is the most pieces one sendmsg takes (UIO_MAXIOV).
const maxIovecs = 1024

// replyTimeout bounds the wait for the kernel's answer to a batch, which
// it gives before sendmsg returns; the wait only guards against a kernel
// that does not.
const replyTimeout = 30 * time.Second

// maxReported bounds the refused messages an error names.
const maxReported = 3

// framed is a batch ready to send: its pieces between BATCH_BEGIN and
// BATCH_END, every message numbered (its sequence number, which the
// kernel's answer to it carries) from first, BATCH_BEGIN's.
type framed struct {
	iov  [][]byte
	size int
	// first is BATCH_BEGIN's number; last is that of the last message
	// before BATCH_END, the one acknowledged: the kernel answers it last,
	// whether the batch applied or not. Errors name the messages the
	// kernel refused.
	first, last uint32
}

// frame numbers the batch's messages from first and asks for an
// acknowledgement of the last. The kernel reports each message it
// refuses whether asked or not, so one acknowledgement tells that it
// answered them all.
func (b *batch) frame(first uint32) framed {
	f := framed{iov: [][]byte{batchMessage(unix.NFNL_MSG_BATCH_BEGIN, first)}, first: first}
	seq := first
	var lastHeader []byte
	for _, p := range b.pieces {
		p.walk(func(h []byte) {
			seq++
			binary.NativeEndian.PutUint32(h[8:], seq)
			lastHeader = h
		})
		for _, blk := range p.blocks {
			if len(blk) > 0 {
				f.iov = append(f.iov, blk)
			}
		}
	}
	if lastHeader != nil {
		flags := binary.NativeEndian.Uint16(lastHeader[6:])
		binary.NativeEndian.PutUint16(lastHeader[6:], flags|unix.NLM_F_ACK)
	}
	f.last = seq
	f.iov = append(f.iov, batchMessage(unix.NFNL_MSG_BATCH_END, seq+1))
	for _, v := range f.iov {
		f.size += len(v)
	}
	if len(f.iov) > maxIovecs {
		f.iov = [][]byte{joined(f.iov, f.size)}
	}
	return f
}

// walk calls fn with the header of each message in the stream; a header
// never spans two blocks (stream.begin).
func (s *stream) walk(fn func(header []byte)) {
	blk, off := 0, 0
	for blk < len(s.blocks) {
		if off >= len(s.blocks[blk]) {
			off -= len(s.blocks[blk])
			blk++
			continue
		}
		h := s.blocks[blk][off : off+nlmsgHeaderLen]
		fn(h)
		off += int(binary.NativeEndian.Uint32(h))
	}
}

// batchMessage is BATCH_BEGIN or BATCH_END for nf_tables.
func batchMessage(typ uint16, seq uint32) []byte {
	m := make([]byte, nlmsgHeaderLen+nfgenLen)
	binary.NativeEndian.PutUint32(m, uint32(len(m)))
	binary.NativeEndian.PutUint16(m[4:], typ)
	binary.NativeEndian.PutUint16(m[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(m[8:], seq)
	binary.BigEndian.PutUint16(m[18:], unix.NFNL_SUBSYS_NFTABLES)
	return m
}

func joined(pieces [][]byte, size int) []byte {
	out := make([]byte, 0, size)
	for _, p := range pieces {
		out = append(out, p...)
	}
	return out
}

// message returns the batch's message numbered seq, or nil.
func (b *batch) message(seq uint32) []byte {
	for _, p := range b.pieces {
		var found []byte
		eachMessage(p.bytes(), func(m []byte) {
			if binary.NativeEndian.Uint32(m[8:]) == seq {
				found = m
			}
		})
		if found != nil {
			return found
		}
	}
	return nil
}

// answerBuffer holds one answer of the kernel: an error repeats the
// refused message, which is under 64 KiB (maxListBytes).
const answerBuffer = 128 << 10

// sendBatch sends f on c in one sendmsg and reads the kernel's answers
// into buf (answerBuffer bytes). It returns the errors of the refused
// messages, described from b.
func sendBatch(c *netlink.Conn, buf []byte, b *batch, f framed) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), f.iov, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("sendmsg of %d bytes: %w", f.size, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return err
	}
	refused, err := readAnswers(raw, buf, f)
	if err != nil {
		return err
	}
	return b.refusal(refused, f.first)
}

// answer is the kernel's answer to one message: its number and errno (0
// for an acknowledgement).
type answer struct {
	seq   uint32
	errno syscall.Errno
}

// readAnswers reads the answers to f's messages until the one to the last,
// or to BATCH_BEGIN (the kernel refused the batch as a whole), and returns
// the refusals; answers to other messages are not f's, and ignored.
func readAnswers(raw syscall.RawConn, buf []byte, f framed) ([]answer, error) {
	var refused []answer
	for done := false; !done; {
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err = errors.Join(err, rerr); err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return refused, fmt.Errorf("read the kernel's answer: %w", err)
		}
		eachMessage(buf[:n], func(m []byte) {
			a, ok := answerOf(m)
			if !ok || a.seq < f.first || a.seq > f.last {
				return
			}
			if a.errno != 0 {
				refused = append(refused, a)
			}
			done = done || a.seq == f.last || (a.seq == f.first && a.errno != 0)
		})
	}
	return refused, nil
}

// answerOf decodes an NLMSG_ERROR message; false for anything else.
func answerOf(m []byte) (answer, bool) {
	if len(m) < nlmsgHeaderLen+4 || binary.NativeEndian.Uint16(m[4:]) != unix.NLMSG_ERROR {
		return answer{}, false
	}
	code := int32(binary.NativeEndian.Uint32(m[nlmsgHeaderLen:]))
	return answer{seq: binary.NativeEndian.Uint32(m[8:]), errno: syscall.Errno(-code)}, true
}

// eachMessage calls fn with each netlink message in b.
func eachMessage(b []byte, fn func(m []byte)) {
	for len(b) >= nlmsgHeaderLen {
		n := int(binary.NativeEndian.Uint32(b))
		if n < nlmsgHeaderLen || n > len(b) {
			return
		}
		fn(b[:n])
		b = b[min(align4(n), len(b)):]
	}
}

// refusal describes the refused messages of the batch numbered from
// first; nil for none.
func (b *batch) refusal(refused []answer, first uint32) error {
	var errs []error
	for i, a := range refused {
		if i == maxReported {
			errs = append(errs, fmt.Errorf("and %d more", len(refused)-i))
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", b.describe(a.seq, first), a.errno))
	}
	return errors.Join(errs...)
}

// describe names the batch's message seq for an error, by its place in
// the batch numbered from first and what it does to which object.
func (b *batch) describe(seq, first uint32) string {
	m := b.message(seq)
	place := seq - first + 1
	if seq == first || len(m) < nlmsgHeaderLen+nfgenLen {
		return fmt.Sprintf("message %d of the batch", place)
	}
	typ := binary.NativeEndian.Uint16(m[4:]) & 0xff
	kw := famV4.kw
	if m[nlmsgHeaderLen] == byte(famV6.table) {
		kw = famV6.kw
	}
	table, object := "", ""
	_ = eachAttr(m[nlmsgHeaderLen+nfgenLen:], func(t uint16, data []byte) error {
		switch t {
		case unix.NFTA_TABLE_NAME:
			table = strings.TrimRight(string(data), "\x00")
		case objectAttr[typ]:
			object = strings.TrimRight(string(data), "\x00")
		}
		return nil
	})
	if object == "" {
		return fmt.Sprintf("message %d of the batch: %s %s %s", place, msgNames[typ], kw, table)
	}
	return fmt.Sprintf("message %d of the batch: %s %s of table %s %s", place, msgNames[typ], object, kw, table)
}

// objectAttr is the attribute naming the object of each kind of message
// but the tables'.
var objectAttr = map[uint16]uint16{
	unix.NFT_MSG_NEWCHAIN: unix.NFTA_CHAIN_NAME, unix.NFT_MSG_DELCHAIN: unix.NFTA_CHAIN_NAME,
	unix.NFT_MSG_NEWRULE: unix.NFTA_RULE_CHAIN, unix.NFT_MSG_DELRULE: unix.NFTA_RULE_CHAIN,
	unix.NFT_MSG_NEWSET: unix.NFTA_SET_NAME, unix.NFT_MSG_DELSET: unix.NFTA_SET_NAME,
	unix.NFT_MSG_NEWSETELEM: unix.NFTA_SET_ELEM_LIST_SET, unix.NFT_MSG_DELSETELEM: unix.NFTA_SET_ELEM_LIST_SET,
}

var msgNames = map[uint16]string{
	unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
	unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
	unix.NFT_MSG_NEWRULE: "add a rule to chain", unix.NFT_MSG_DELRULE: "flush chain",
	unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
	unix.NFT_MSG_NEWSETELEM: "add elements to set", unix.NFT_MSG_DELSETELEM: "delete elements of set",
}
