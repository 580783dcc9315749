package conntrack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

func TestParseEntry(t *testing.T) {
	e := &fakeEntry{proto: unix.IPPROTO_UDP, orig: netip.MustParseAddrPort("[fd00::2]:1"),
		origDst: fakeVIP6, replySrc: fakeA6, zone: 3, id: 42}
	got, ok, err := parseEntry(e.payload(), func(tuple) bool { return true })
	if err != nil || !ok {
		t.Fatalf("parse: %v, %v", ok, err)
	}
	want := entry{family: unix.AF_INET6,
		orig:  tuple{proto: unix.IPPROTO_UDP, src: e.orig, dst: e.origDst},
		reply: tuple{proto: unix.IPPROTO_UDP, src: e.replySrc, dst: e.orig}}
	if got.family != want.family || got.orig != want.orig || got.reply != want.reply {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if s := got.String(); s != "udp [fd00::2]:1 -> [fd00:96::10]:53 reply from [fd00:244::5]:5353" {
		t.Errorf("String = %q", s)
	}
	m := got.toMatch("flow x")
	if !bytes.Equal(m.attrs, e.wantDelete()) || m.family != unix.AF_INET6 || m.why != "flow x" {
		t.Errorf("delete payload %x, want %x", m.attrs, e.wantDelete())
	}

	calls := 0
	if _, ok, err := parseEntry(e.payload(), func(tuple) bool { calls++; return false }); ok || err != nil || calls != 1 {
		t.Errorf("unwanted entry: ok %v, err %v, calls %d", ok, err, calls)
	}
}

func TestParseMalformed(t *testing.T) {
	good := (&fakeEntry{proto: unix.IPPROTO_UDP, orig: netip.MustParseAddrPort("10.0.0.1:1"),
		origDst: fakeVIP, replySrc: fakeA, id: 1}).payload()
	cases := map[string][]byte{
		"short":           good[:2],
		"truncated":       good[:len(good)-3],
		"no orig tuple":   {unix.AF_INET, 0, 0, 0},
		"attribute len 2": append([]byte{unix.AF_INET, 0, 0, 0}, 2, 0, 1, 0),
		"bad address": append([]byte{unix.AF_INET, 0, 0, 0},
			nla(ctaTupleOrig|unix.NLA_F_NESTED, nla(ctaTupleIP|unix.NLA_F_NESTED, nla(ctaIPv4Src, []byte{1, 2, 3})))...),
	}
	for name, b := range cases {
		if _, _, err := parseEntry(b, func(tuple) bool { return true }); !errors.Is(err, errMalformed) {
			t.Errorf("%s: got %v, want errMalformed", name, err)
		}
	}
}

func FuzzParseEntry(f *testing.F) {
	entries, _ := fakeTable()
	for _, e := range entries[:3] {
		f.Add(e.payload())
	}
	flows := []Flow{{Protocol: plan.UDP, Dest: fakeVIP}, {Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, 53)}}
	idx, _ := newIndex(flows)
	f.Fuzz(func(t *testing.T, b []byte) {
		pick := func(e *entry) (string, bool) { return idx.pick(e, flows) }
		if m, ok, err := selectEntry(b, idx.wants, pick); ok && (err != nil || len(m.attrs) == 0) {
			t.Errorf("matched with error %v and %d attribute bytes", err, len(m.attrs))
		}
	})
}

func TestFlowValidate(t *testing.T) {
	cases := map[string]struct {
		f    Flow
		want string // "" for valid
	}{
		"udp":           {Flow{Protocol: plan.UDP, Dest: fakeVIP, Endpoint: fakeA.Addr()}, ""},
		"sctp node":     {Flow{Protocol: plan.SCTP, Dest: netip.AddrPortFrom(netip.Addr{}, 30000), Endpoint: fakeA6.Addr()}, ""},
		"mapped":        {Flow{Protocol: plan.UDP, Dest: netip.MustParseAddrPort("[::ffff:10.96.0.10]:53"), Endpoint: fakeA.Addr()}, ""},
		"tcp":           {Flow{Protocol: plan.TCP, Dest: fakeVIP}, "flow TCP 10.96.0.10:53: protocol must be UDP or SCTP"},
		"lowercase":     {Flow{Protocol: "udp", Dest: fakeVIP}, "protocol must be UDP or SCTP"},
		"port 0":        {Flow{Protocol: plan.UDP, Dest: netip.AddrPortFrom(fakeVIP.Addr(), 0)}, "flow UDP 10.96.0.10:0: destination port is 0"},
		"mixed familes": {Flow{Protocol: plan.UDP, Dest: fakeVIP, Endpoint: fakeA6.Addr()}, "different IP families"},
	}
	for name, c := range cases {
		err := c.f.validate()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}

func TestAckError(t *testing.T) {
	req := nlmsg(msgCtDelete, unix.NLM_F_REQUEST|unix.NLM_F_ACK, 9, make([]byte, 10))
	text := nla(unix.NLMSGERR_ATTR_MSG, []byte("no such thing\x00"))
	errno := errnoBytes(unix.EINVAL)
	cases := map[string]struct {
		flags   uint16
		payload []byte
		want    string
	}{
		"ack":           {0, append(binary.NativeEndian.AppendUint32(nil, 0), req[:16]...), ""},
		"plain":         {0, append(errno, req...), "invalid argument"},
		"capped":        {unix.NLM_F_CAPPED | unix.NLM_F_ACK_TLVS, append(append(errno, req[:16]...), text...), "invalid argument: no such thing"},
		"echoed":        {unix.NLM_F_ACK_TLVS, append(append(errno, req...), text...), "invalid argument: no such thing"},
		"echo too long": {unix.NLM_F_ACK_TLVS, append(errno, req[:20]...), "invalid argument"},
	}
	for name, c := range cases {
		err := ackError(syscall.NetlinkMessage{Header: syscall.NlMsghdr{Flags: c.flags}, Data: c.payload})
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s: got %q, want %q", name, got, c.want)
		}
	}
}
