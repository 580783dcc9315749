package conntrack

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

var discard = slog.New(slog.DiscardHandler)

var (
	fakeVIP    = netip.MustParseAddrPort("10.96.0.10:53")
	fakeVIP6   = netip.MustParseAddrPort("[fd00:96::10]:53")
	fakeNode   = netip.MustParseAddr("172.30.0.1")
	fakeClient = netip.MustParseAddr("172.30.0.2")
	fakeA      = netip.MustParseAddrPort("10.244.0.5:5353")
	fakeB      = netip.MustParseAddrPort("10.244.0.6:5353")
	fakeA6     = netip.MustParseAddrPort("[fd00:244::5]:5353")
)

// fakeTable returns entries of which matching (by the flows of
// TestClearFake) are the first want.
func fakeTable() (entries []*fakeEntry, want int) {
	id := uint32(0)
	add := func(proto uint8, src, dst, reply netip.AddrPort) *fakeEntry {
		id++
		e := &fakeEntry{proto: proto, orig: src, origDst: dst, replySrc: reply, id: id}
		entries = append(entries, e)
		return e
	}
	client := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(fakeClient, port) }
	for i := range 100 {
		e := add(unix.IPPROTO_UDP, client(uint16(1000+i)), fakeVIP, fakeA)
		if i%10 == 0 {
			e.zone = 7
		}
	}
	add(unix.IPPROTO_UDP, client(2000), netip.AddrPortFrom(fakeNode, 30053), fakeA)
	add(unix.IPPROTO_UDP, netip.MustParseAddrPort("[fd00::2]:1"), fakeVIP6, fakeA6)
	add(unix.IPPROTO_SCTP, client(3000), fakeVIP, fakeB)
	want = len(entries)

	for i := range 10 {
		add(unix.IPPROTO_UDP, client(uint16(4000+i)), fakeVIP, fakeB) // another endpoint
		add(unix.IPPROTO_TCP, client(uint16(5000+i)), fakeVIP, fakeA) // TCP
	}
	add(unix.IPPROTO_UDP, client(6000), netip.AddrPortFrom(fakeNode, 30053), fakeB)
	add(unix.IPPROTO_UDP, client(6001), netip.AddrPortFrom(fakeNode, 30054), fakeA)
	add(unix.IPPROTO_UDP, client(6002), netip.AddrPortFrom(fakeVIP.Addr(), 54), fakeA)
	add(unix.IPPROTO_SCTP, client(6003), netip.MustParseAddrPort("10.96.0.11:53"), fakeB)
	add(unix.IPPROTO_UDP, netip.MustParseAddrPort("[fd00::2]:2"), fakeVIP6, netip.MustParseAddrPort("[fd00:244::6]:53"))
	return entries, want
}

func TestClearFake(t *testing.T) {
	entries, want := fakeTable()
	entries[3].errno, entries[3].errMsg = unix.EPERM, "fake: not allowed"
	entries[4].errno = unix.ENOENT // expired since the dump
	k := &fakeKernel{t: t, entries: entries, perRead: 7}
	flows := []Flow{
		{Protocol: plan.UDP, Dest: fakeVIP, Endpoint: fakeA.Addr()},
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: fakeA.Addr()},
		{Protocol: plan.UDP, Dest: fakeVIP6, Endpoint: fakeA6.Addr()},
		{Protocol: plan.SCTP, Dest: fakeVIP},
		{Protocol: plan.TCP, Dest: fakeVIP},
	}
	n, err := k.cleaner().Clear(context.Background(), flows)
	k.wg.Wait() // the fake's last reads happen after Clear returns
	if n != want-2 {
		t.Errorf("deleted %d, want %d", n, want-2)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, part := range []string{
		"conntrack: flow TCP 10.96.0.10:53: protocol must be UDP or SCTP",
		"conntrack: delete udp 172.30.0.2:1003 -> 10.96.0.10:53 reply from 10.244.0.5:5353 (flow UDP 10.96.0.10:53 -> 10.244.0.5): operation not permitted: fake: not allowed",
	} {
		if !strings.Contains(msg, part) {
			t.Errorf("error %q lacks %q", msg, part)
		}
	}
	if strings.Count(msg, "\n") != 1 {
		t.Errorf("want exactly two errors, got %q", msg)
	}
	for i, e := range entries {
		if deleted := e.deleteAttributes != nil; deleted != (i < want) {
			t.Errorf("entry %d (%s -> %s, reply from %s): deleted %v", e.id, e.orig, e.origDst, e.replySrc, deleted)
		}
	}
	if k.dials != 1 || k.dumps != 1 || k.deletes != want || k.writes != 2 {
		t.Errorf("dials %d, dumps %d, deletes %d in %d writes; want 1, 1, %d in 2", k.dials, k.dumps, k.deletes, k.writes, want)
	}
}

func TestClearNothing(t *testing.T) {
	k := &fakeKernel{t: t}
	c := k.cleaner()
	n, err := c.Clear(context.Background(), nil)
	if n != 0 || err != nil {
		t.Errorf("Clear(nil) = %d, %v", n, err)
	}
	n, err = c.Clear(context.Background(), []Flow{{Protocol: plan.TCP, Dest: fakeVIP}, {Protocol: plan.UDP}})
	if n != 0 || err == nil || !strings.Contains(err.Error(), "flow UDP *:0: destination port is 0") {
		t.Errorf("Clear(invalid) = %d, %v", n, err)
	}
	k.wg.Wait()
	if k.dials != 0 {
		t.Errorf("opened %d sockets for no valid flow", k.dials)
	}
}

func TestClearDumpError(t *testing.T) {
	k := &fakeKernel{t: t, dumpErr: unix.EPERM}
	_, err := k.cleaner().Clear(context.Background(), []Flow{{Protocol: plan.UDP, Dest: fakeVIP}})
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "dump for UDP 10.96.0.10:53") {
		t.Errorf("got %v, want EPERM naming the flow", err)
	}
}

func TestClearContext(t *testing.T) {
	k := &fakeKernel{t: t, hang: true}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := k.cleaner().Clear(ctx, []Flow{{Protocol: plan.UDP, Dest: fakeVIP}})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Errorf("got %v after %v, want the context's deadline", err, time.Since(start))
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = k.cleaner().Clear(ctx, []Flow{{Protocol: plan.UDP, Dest: fakeVIP}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

func TestClosedCleaner(t *testing.T) {
	k := &fakeKernel{t: t}
	c := k.cleaner()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Clear(context.Background(), []Flow{{Protocol: plan.UDP, Dest: fakeVIP}}); err == nil {
		t.Error("Clear after Close succeeded")
	}
}

func TestNewBadNamespace(t *testing.T) {
	if _, err := New(987654, nil); err == nil {
		t.Error("New accepted a closed descriptor")
	}
}
