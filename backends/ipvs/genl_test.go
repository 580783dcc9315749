package ipvs

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// littleEndian reports whether the hand-written bytes below apply.
func littleEndian() bool { return native.Uint16([]byte{1, 0}) == 1 }

// unhex decodes hex written in groups with spaces, one line a field,
// each with a comment after '#'.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	var digits strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(digits.String())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	webKey = vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.TCP, port: 80}
	webPod = netip.MustParseAddrPort("10.244.0.11:8080")
)

// TestAppendOpBytes checks one service and one real server request byte
// by byte against the layout of include/uapi/linux/ip_vs.h.
func TestAppendOpBytes(t *testing.T) {
	if !littleEndian() {
		t.Skip("bytes written for a little-endian host")
	}
	got := appendOp(nil, 0x22, 7, op{kind: opAddVS, key: webKey, vs: newVirtualServer("rr", 0)}, false)
	want := unhex(t, `
		68000000 2200 0500 07000000 00000000  # nlmsghdr: 104 bytes, family 0x22, REQUEST|ACK, seq 7
		01 01 0000                            # genlmsghdr: IPVS_CMD_NEW_SERVICE, version 1
		5400 0100                             # IPVS_CMD_ATTR_SERVICE, 84 bytes
		0600 0100 0200 0000                   # AF: AF_INET
		0600 0200 0600 0000                   # PROTOCOL: TCP
		1400 0300 0a60000a 00000000 00000000 00000000  # ADDR: 10.96.0.10
		0600 0400 0050 0000                   # PORT: 80, big-endian
		0700 0600 727200 00                   # SCHED_NAME: "rr\0"
		0c00 0700 00000000 ffffffff           # FLAGS: flags 0, mask all
		0800 0800 00000000                    # TIMEOUT: 0
		0800 0900 ffffffff                    # NETMASK: /32`)
	if !bytes.Equal(got, want) {
		t.Errorf("add-vs:\n got %x\nwant %x", got, want)
	}
	got = appendOp(nil, 0x22, 8, op{kind: opAddRS, key: webKey, real: webPod, weight: 1}, false)
	want = unhex(t, `
		8c000000 2200 0500 08000000 00000000  # nlmsghdr: 140 bytes
		05 01 0000                            # IPVS_CMD_NEW_DEST
		3000 0100                             # service, key only: 48 bytes
		0600 0100 0200 0000
		0600 0200 0600 0000
		1400 0300 0a60000a 00000000 00000000 00000000
		0600 0400 0050 0000
		4800 0200                             # IPVS_CMD_ATTR_DEST, 72 bytes
		1400 0100 0af4000b 00000000 00000000 00000000  # ADDR: 10.244.0.11
		0600 0200 1f90 0000                   # PORT: 8080
		0800 0300 00000000                    # FWD_METHOD: masquerade
		0800 0400 01000000                    # WEIGHT: 1
		0800 0500 00000000                    # U_THRESH
		0800 0600 00000000                    # L_THRESH
		0600 0b00 0200 0000                   # ADDR_FAMILY: AF_INET`)
	if !bytes.Equal(got, want) {
		t.Errorf("add-rs:\n got %x\nwant %x", got, want)
	}
}

// parseOne splits one request into its header and generic-netlink payload.
func parseOne(t *testing.T, b []byte) syscall.NetlinkMessage {
	t.Helper()
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("parse %x: %d messages, %v", b, len(msgs), err)
	}
	if int(msgs[0].Header.Len) != len(b) {
		t.Fatalf("length %d, message has %d bytes", msgs[0].Header.Len, len(b))
	}
	return msgs[0]
}

// TestServiceRoundTrip decodes what the encoder wrote, for each kind of
// virtual server, as readKernel would from a dump.
func TestServiceRoundTrip(t *testing.T) {
	for _, c := range []struct {
		key vsKey
		vs  *virtualServer
	}{
		{webKey, newVirtualServer("rr", 0)},
		{vsKey{addr: netip.MustParseAddr("fd00::10"), proto: plan.UDP, port: 53}, newVirtualServer("lc", 0)},
		{vsKey{addr: netip.MustParseAddr("192.0.2.1"), proto: plan.SCTP, port: 3868}, newVirtualServer("sh", 10800)},
		{markKey(0x10001, 4), newVirtualServer("rr", 0)},
		{markKey(0x10002, 6), newVirtualServer("wrr", 300)},
	} {
		for _, kind := range []opKind{opAddVS, opUpdateVS} {
			m := parseOne(t, appendOp(nil, 0x22, 1, op{kind: kind, key: c.key, vs: c.vs}, false))
			want := map[opKind]uint8{opAddVS: cmdNewService, opUpdateVS: cmdSetService}[kind]
			if m.Data[0] != want || m.Header.Flags != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
				t.Errorf("%s: command %d flags %#x", c.key, m.Data[0], m.Header.Flags)
			}
			s, err := decodeService(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			k, vs, ok := fromService(s)
			if !ok || k != c.key || !vs.sameConfig(c.vs) {
				t.Errorf("%s %s: decoded %s %+v %v", opNames[kind], c.key, k, vs, ok)
			}
		}
		m := parseOne(t, appendOp(nil, 0x22, 1, op{kind: opDelVS, key: c.key}, false))
		s, err := decodeService(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if k, _, ok := fromService(s); m.Data[0] != cmdDelService || !ok || k != c.key || s.SchedName != "" {
			t.Errorf("del-vs %s: command %d, decoded %s %+v", c.key, m.Data[0], k, s)
		}
	}
}

// TestDestRoundTrip decodes the real server of each real-server op and
// the command each op (and its retry) sends.
func TestDestRoundTrip(t *testing.T) {
	v6 := vsKey{addr: netip.MustParseAddr("fd00::10"), proto: plan.TCP, port: 443}
	for _, c := range []struct {
		key       vsKey
		kind      opKind
		real      netip.AddrPort
		weight    int32
		cmd, retr uint8
	}{
		{webKey, opAddRS, webPod, 1, cmdNewDest, cmdSetDest},
		{webKey, opUpdateRS, webPod, 65535, cmdSetDest, cmdSetDest},
		{webKey, opDrainRS, webPod, 0, cmdSetDest, cmdSetDest},
		{webKey, opDelRS, webPod, 0, cmdDelDest, cmdDelDest},
		{v6, opAddRS, netip.MustParseAddrPort("[fd00:10::7]:8443"), 3, cmdNewDest, cmdSetDest},
		{markKey(0x10001, 4), opAddRS, webPod, 2, cmdNewDest, cmdSetDest},
	} {
		o := op{kind: c.kind, key: c.key, real: c.real, weight: c.weight}
		if got := opCommand(o, true); got != c.retr {
			t.Errorf("%s retried: command %d, want %d", o, got, c.retr)
		}
		m := parseOne(t, appendOp(nil, 0x22, 9, o, false))
		if m.Data[0] != c.cmd || m.Header.Seq != 9 {
			t.Errorf("%s: command %d seq %d", o, m.Data[0], m.Header.Seq)
		}
		s, err := decodeService(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if k, _, ok := fromService(s); !ok || k != c.key {
			t.Errorf("%s: service decoded as %s", o, k)
		}
		d, err := decodeDest(m.Data, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, ok := fromDestination(d)
		if !ok || a != c.real || int32(d.Weight) != c.weight || d.ConnectionFlags != fwdMasq {
			t.Errorf("%s: decoded %s w%d fwd %d", o, a, d.Weight, d.ConnectionFlags)
		}
	}
}

// TestDecodeDestFamily falls back to the virtual server's family when
// the kernel sends no ADDR_FAMILY, and reads connection counts.
func TestDecodeDestFamily(t *testing.T) {
	b, at := beginMsg(nil, 0x22, 0, 1, cmdNewDest)
	b, nest := beginNest(b, attrDest)
	b = putAddr(b, destAddr, netip.MustParseAddr("10.0.0.1"))
	b = putPort(b, destPort, 80)
	b = putU32(b, destWeight, 5)
	b = putU32(b, destActive, 2)
	b = putU32(b, destInactive, 3)
	endNest(b, nest)
	endMsg(b, at)
	d, err := decodeDest(parseOne(t, b).Data, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := fromDestination(d)
	if !ok || a != netip.MustParseAddrPort("10.0.0.1:80") || d.Weight != 5 || d.ActiveConnections != 2 || d.InactiveConnections != 3 {
		t.Errorf("decoded %s %+v", a, d)
	}
	if _, err := decodeDest([]byte{1, 1, 0, 0, 9, 0}, unix.AF_INET); err == nil {
		t.Error("malformed attribute decoded")
	}
}

// TestScheduledConns reads the 64-bit counter when the kernel sends it,
// the 32-bit one otherwise, and knows when it sends neither.
func TestScheduledConns(t *testing.T) {
	pod := netip.MustParseAddrPort("10.244.0.11:8080")
	stats := func(typ uint16, v uint64, size int) []byte {
		b, at := beginNest(nil, typ)
		if size == 8 {
			b = putU32(b, 11, 0) // IPVS_STATS_ATTR_PAD, as nla_put_u64_64bit aligns
			b = native.AppendUint64(attrHeader(b, statsConns, 8), v)
		} else {
			b = putU32(b, statsConns, uint32(v))
		}
		b = putU32(b, 2, 99) // inpkts, ignored
		endNest(b, at)
		return b
	}
	build := func(parts ...[]byte) []attr {
		b, at := beginMsg(nil, 0x22, 0, 1, cmdNewDest)
		b, nest := beginNest(b, attrDest)
		b = putAddr(b, destAddr, pod.Addr())
		b = putPort(b, destPort, pod.Port())
		b = putU32(b, destActive, 4)
		for _, p := range parts {
			b = append(b, p...)
		}
		b = putU16(b, destAF, unix.AF_INET)
		endNest(b, nest)
		endMsg(b, at)
		attrs, err := nested(parseOne(t, b).Data, attrDest)
		if err != nil {
			t.Fatal(err)
		}
		return attrs
	}
	for _, c := range []struct {
		name  string
		parts [][]byte
		want  uint64
		known bool
	}{
		{"both", [][]byte{stats(destStats, 7, 4), stats(destStats64, 1<<40, 8)}, 1 << 40, true},
		{"64-bit only", [][]byte{stats(destStats64, 12, 8)}, 12, true},
		{"32-bit only", [][]byte{stats(destStats, 7, 4)}, 7, true},
		{"none", nil, 0, false},
	} {
		attrs := build(c.parts...)
		got, known := scheduledConns(attrs)
		if got != c.want || known != c.known {
			t.Errorf("%s: %d %v, want %d %v", c.name, got, known, c.want, c.known)
		}
		d := destFromAttrs(attrs, unix.AF_INET)
		if a, ok := fromDestination(d); !ok || a != pod || d.ActiveConnections != 4 {
			t.Errorf("%s: destination %s active %d", c.name, a, d.ActiveConnections)
		}
	}
}

// TestWindowEnd bounds each write by count and bytes, never below one
// request.
func TestWindowEnd(t *testing.T) {
	small := make([][]byte, 1000)
	for i := range small {
		small[i] = make([]byte, 100)
	}
	if got := windowEnd(small, 0); got != maxInFlight {
		t.Errorf("small requests: window %d, want %d", got, maxInFlight)
	}
	if got := windowEnd(small, 900); got != 1000 {
		t.Errorf("tail: window ends at %d", got)
	}
	big := [][]byte{make([]byte, writeBytes-10), make([]byte, 20), make([]byte, writeBytes+1)}
	if got := windowEnd(big, 0); got != 1 {
		t.Errorf("byte bound: window ends at %d, want 1", got)
	}
	if got := windowEnd(big, 2); got != 3 {
		t.Errorf("oversized request: window ends at %d, want 3", got)
	}
}

// TestSettle maps the kernel's answers to outcomes without a retry.
func TestSettle(t *testing.T) {
	c := &genlConn{}
	del := op{kind: opDelRS, key: webKey, real: webPod}
	for _, e := range []error{nil, unix.ESRCH, unix.ENOENT} {
		if err := c.settle(del, e); err != nil {
			t.Errorf("del-rs answered %v: %v", e, err)
		}
	}
	if err := c.settle(op{kind: opUpdateRS, key: webKey, real: webPod}, unix.ENOENT); !errors.Is(err, unix.ENOENT) {
		t.Errorf("update-rs answered ENOENT: %v", err)
	}
	if err := c.settle(op{kind: opAddVS, key: webKey, vs: newVirtualServer("rr", 0)}, unix.EINVAL); !errors.Is(err, unix.EINVAL) {
		t.Errorf("add-vs answered EINVAL: %v", err)
	}
}

// BenchmarkAppendOps encodes the ops of 1k virtual servers × 10 real
// servers into one buffer, as applyBatch does.
func BenchmarkAppendOps(b *testing.B) {
	var ops []op
	for i := range 1000 {
		k := vsKey{addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), proto: plan.TCP, port: 80}
		ops = append(ops, op{kind: opAddVS, key: k, vs: newVirtualServer("rr", 0)})
		for j := range 10 {
			a := netip.AddrFrom4([4]byte{10, 244, byte(i >> 4), byte(i<<4 + j + 1)})
			ops = append(ops, op{kind: opAddRS, key: k, real: netip.AddrPortFrom(a, 8080), weight: 1})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		buf := make([]byte, 0, 192*len(ops))
		for i, o := range ops {
			buf = appendOp(buf, 0x22, uint32(i), o, false)
		}
	}
}

// openCtrl returns a client of the generic netlink controller, which
// every kernel has, so the transport is tested without IPVS.
func openCtrl(t *testing.T) *genlConn {
	t.Helper()
	s, err := nl.GetNetlinkSocketAt(vnetns.None(), vnetns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		t.Skipf("no generic netlink socket: %v", err)
	}
	c, err := onSocket(s, unix.GENL_ID_CTRL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// getFamily is a CTRL_CMD_GETFAMILY request for name.
func getFamily(c *genlConn, seq uint32, name string, flags uint16) []byte {
	b, at := beginMsg(nil, c.family, unix.NLM_F_REQUEST|flags, seq, unix.CTRL_CMD_GETFAMILY)
	b = putString(b, unix.CTRL_ATTR_FAMILY_NAME, name)
	endMsg(b, at)
	return b
}

// TestPipelineMapsAcksToRequests sends more requests than one write
// holds, all but every 16th failing (the others' replies are large: a
// receive buffer without CAP_NET_ADMIN must hold a window of them), and
// checks each answer lands on its request.
func TestPipelineMapsAcksToRequests(t *testing.T) {
	c := openCtrl(t)
	const n = 2*maxInFlight + 45
	first := c.seq + 1
	reqs := make([][]byte, n)
	for i := range reqs {
		name := "nlctrl"
		if i%16 != 0 {
			name = "weir-no-such-family"
		}
		reqs[i] = getFamily(c, c.nextSeq(), name, unix.NLM_F_ACK)
	}
	errs, err := c.pipeline(reqs, first)
	if err != nil || len(errs) != n {
		t.Fatalf("%d answers, error %v", len(errs), err)
	}
	for i, e := range errs {
		var errno syscall.Errno
		if failing := i%16 != 0; failing != errors.As(e, &errno) || (!failing && e != nil) {
			t.Fatalf("request %d answered %v", i, e)
		}
	}
}

// TestDumpReadsUntilDone dumps every family through the controller.
func TestDumpReadsUntilDone(t *testing.T) {
	c := openCtrl(t)
	for range 3 { // the socket takes the next dump once one is done
		seq := c.nextSeq()
		b, at := beginMsg(nil, c.family, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, unix.CTRL_CMD_GETFAMILY)
		endMsg(b, at)
		var names []string
		err := c.dump(b, seq, func(p []byte) error {
			attrs, err := parseAttrs(p[4:])
			for _, a := range attrs {
				if a.typ == unix.CTRL_ATTR_FAMILY_NAME {
					names = append(names, cString(a.data))
				}
			}
			return err
		})
		if err != nil || !slices.Contains(names, "nlctrl") {
			t.Fatalf("dump: families %v, error %v", names, err)
		}
	}
}

// TestReadWaitsAndTimesOut: with nothing to read, read waits for its
// timeout and says so.
func TestReadWaitsAndTimesOut(t *testing.T) {
	c := openCtrl(t)
	c.timeout = 50 * time.Millisecond
	if _, err := c.read(); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("read on a quiet socket: %v", err)
	}
}
