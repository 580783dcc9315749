package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
)

const (
	tcpFinWait  = 4
	tcpTimeWait = 7
)

var (
	loadVIP = netip.MustParseAddrPort("10.96.0.20:80")
	loadNP  = netip.AddrPortFrom(netip.Addr{}, 30080)
	loadA   = netip.MustParseAddrPort("10.244.0.5:8080")
	loadB   = netip.MustParseAddrPort("10.244.0.6:8080")
	loadC   = netip.MustParseAddrPort("10.244.0.7:8080") // serves no more
)

// loadServing is a TCP service with a node port and a UDP one on the
// same VIP, both served by a and b.
func loadServing() []Serving {
	eps := []netip.Addr{loadA.Addr(), loadB.Addr()}
	return []Serving{
		{Protocol: plan.TCP, Dest: loadVIP, Endpoints: eps},
		{Protocol: plan.TCP, Dest: loadNP, Endpoints: eps},
		{Protocol: plan.UDP, Dest: netip.AddrPortFrom(loadVIP.Addr(), 53), Endpoints: eps},
	}
}

// loadTable is a fake table of entries to loadServing's destinations and
// some to elsewhere, numbered from id.
type loadTable struct {
	entries []*fakeEntry
	id      uint32
	port    uint16
}

func (lt *loadTable) add(proto, state uint8, dst, reply netip.AddrPort) *fakeEntry {
	lt.id++
	lt.port++
	e := &fakeEntry{proto: proto, tcpState: state, orig: netip.AddrPortFrom(fakeClient, 10000+lt.port),
		origDst: dst, replySrc: reply, id: lt.id}
	lt.entries = append(lt.entries, e)
	return e
}

// wantLoad compares the counts of one destination, a's, b's and the
// stale ones, each as {Tracked, Active, New}.
func wantLoad(t *testing.T, what string, d DestLoad, a, b, stale EndpointLoad) {
	t.Helper()
	if d.Endpoints[0] != a || d.Endpoints[1] != b || d.Stale != stale {
		t.Errorf("%s: a %+v, b %+v, stale %+v; want a %+v, b %+v, stale %+v", what, d.Endpoints[0], d.Endpoints[1], d.Stale, a, b, stale)
	}
}

// TestLoadActiveAndNew reads a fake table twice: open TCP entries count as
// active, closing ones only as tracked, every UDP entry as active, and the
// second read counts as new only the entries added in between.
func TestLoadActiveAndNew(t *testing.T) {
	var lt loadTable
	for _, s := range []uint8{tcpEstablished, tcpEstablished, tcpSynSent, tcpSynRecv, tcpTimeWait, tcpFinWait} {
		lt.add(unix.IPPROTO_TCP, s, loadVIP, loadA)
	}
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadB)
	lt.add(unix.IPPROTO_TCP, tcpEstablished, netip.AddrPortFrom(fakeNode, 30080), loadB)
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadC)
	lt.add(unix.IPPROTO_UDP, 0, netip.AddrPortFrom(loadVIP.Addr(), 53), loadA)
	lt.add(unix.IPPROTO_TCP, tcpEstablished, netip.MustParseAddrPort("10.96.0.21:80"), loadA) // another service
	lt.add(unix.IPPROTO_UDP, 0, loadVIP, loadA)                                               // UDP to the TCP port
	k := &fakeKernel{t: t, entries: lt.entries, perRead: 4}
	l := NewLoad(k.cleaner(), Limits{})

	rep, err := l.Read(testCtx(t), loadServing())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Examined != len(lt.entries) || rep.Truncated || !rep.Since.IsZero() {
		t.Fatalf("first read: examined %d, truncated %v, since %v; want %d, false, zero", rep.Examined, rep.Truncated, rep.Since, len(lt.entries))
	}
	wantLoad(t, "VIP, first read", rep.Dests[0], EndpointLoad{6, 4, 0}, EndpointLoad{1, 1, 0}, EndpointLoad{1, 1, 0})
	wantLoad(t, "node port, first read", rep.Dests[1], EndpointLoad{}, EndpointLoad{1, 1, 0}, EndpointLoad{})
	wantLoad(t, "UDP, first read", rep.Dests[2], EndpointLoad{1, 1, 0}, EndpointLoad{}, EndpointLoad{})
	if !slices.Equal(rep.Dests[0].StaleFrom, []netip.Addr{loadC.Addr()}) {
		t.Errorf("stale from %v; want c", rep.Dests[0].StaleFrom)
	}

	// Between the reads: two established entries end, one closes, and
	// three connections open, one of them closed already. The fake's
	// goroutines end first, so the table changes between dumps.
	k.wg.Wait()
	k.mu.Lock()
	k.entries = slices.Delete(k.entries, 0, 2)
	k.entries[1].tcpState = tcpTimeWait // the SYN_RECV one
	lt.entries = k.entries
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadA)
	lt.add(unix.IPPROTO_TCP, tcpTimeWait, loadVIP, loadA)
	lt.add(unix.IPPROTO_UDP, 0, netip.AddrPortFrom(fakeNode, 53), loadB) // no UDP node port: not wanted
	lt.add(unix.IPPROTO_TCP, tcpEstablished, netip.AddrPortFrom(fakeNode, 30080), loadB)
	k.entries = lt.entries
	k.mu.Unlock()
	before := time.Now()
	rep2, err := l.Read(testCtx(t), loadServing())
	if err != nil {
		t.Fatal(err)
	}
	if rep2.Since.IsZero() || rep2.Since.After(before) {
		t.Errorf("second read: since %v; want the first read's start", rep2.Since)
	}
	wantLoad(t, "VIP, second read", rep2.Dests[0], EndpointLoad{6, 2, 2}, EndpointLoad{1, 1, 0}, EndpointLoad{1, 1, 0})
	wantLoad(t, "node port, second read", rep2.Dests[1], EndpointLoad{}, EndpointLoad{2, 2, 1}, EndpointLoad{})

	// Nothing changes: nothing is new.
	rep3, err := l.Read(testCtx(t), loadServing())
	if err != nil {
		t.Fatal(err)
	}
	wantLoad(t, "VIP, third read", rep3.Dests[0], EndpointLoad{6, 2, 0}, EndpointLoad{1, 1, 0}, EndpointLoad{1, 1, 0})
}

// TestLoadMaxEntries stops a read at the entry limit and says so; a
// truncated read does not become the one New counts from.
func TestLoadMaxEntries(t *testing.T) {
	var lt loadTable
	for range 10 {
		lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadA)
	}
	k := &fakeKernel{t: t, entries: lt.entries, perRead: 3, mayStop: true}
	l := NewLoad(k.cleaner(), Limits{MaxEntries: 4})
	rep, err := l.Read(testCtx(t), loadServing())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Truncated || rep.Examined != 4 || rep.Dests[0].Endpoints[0].Active != 4 {
		t.Fatalf("limited read: truncated %v, examined %d, a %+v; want true, 4, 4 active", rep.Truncated, rep.Examined, rep.Dests[0].Endpoints[0])
	}
	l.limits.MaxEntries = 10 // exactly the table: not truncated
	if rep, err = l.Read(testCtx(t), loadServing()); err != nil || rep.Truncated || !rep.Since.IsZero() || rep.Dests[0].Endpoints[0].New != 0 {
		t.Fatalf("read of the whole table after a truncated one: %+v, %v; want complete, no Since, nothing new", rep, err)
	}
	k.wg.Wait()
	k.mu.Lock()
	k.entries = append(k.entries, lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadA))
	k.mu.Unlock()
	l.limits.MaxEntries = 5
	if rep, err = l.Read(testCtx(t), loadServing()); err != nil || !rep.Truncated || rep.Since.IsZero() {
		t.Fatalf("truncated read after a complete one: %+v, %v; want truncated, with Since", rep, err)
	}
	l.limits.MaxEntries = -1
	rep, err = l.Read(testCtx(t), loadServing())
	if err != nil || rep.Truncated || rep.Dests[0].Endpoints[0] != (EndpointLoad{11, 11, 1}) {
		t.Fatalf("unlimited read: %+v, %v; want 11 tracked and active, 1 new since the complete read", rep.Dests[0].Endpoints[0], err)
	}
}

// TestLoadMaxTime: a kernel that never answers ends the read at MaxTime,
// truncated and without error, but at the context's deadline with an
// error.
func TestLoadMaxTime(t *testing.T) {
	k := &fakeKernel{t: t, hang: true}
	l := NewLoad(k.cleaner(), Limits{MaxTime: 50 * time.Millisecond})
	rep, err := l.Read(testCtx(t), loadServing())
	if err != nil || !rep.Truncated || rep.Examined != 0 {
		t.Fatalf("read past MaxTime: %+v, %v; want truncated, no error", rep, err)
	}
	l.limits.MaxTime = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if rep, err := l.Read(ctx, loadServing()); !errors.Is(err, context.DeadlineExceeded) || rep != nil {
		t.Fatalf("read past the context's deadline: %+v, %v; want a deadline error", rep, err)
	}
}

// TestLoadLongEndpointList counts by a map what a scan would.
func TestLoadLongEndpointList(t *testing.T) {
	var eps []netip.Addr
	for i := range linearEndpoints + 4 {
		eps = append(eps, netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}))
	}
	var lt loadTable
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, netip.AddrPortFrom(eps[19], 8080))
	lt.add(unix.IPPROTO_TCP, tcpTimeWait, loadVIP, netip.AddrPortFrom(eps[0], 8080))
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadC)
	k := &fakeKernel{t: t, entries: lt.entries}
	rep, err := NewLoad(k.cleaner(), Limits{}).Read(testCtx(t), []Serving{{Protocol: plan.TCP, Dest: loadVIP, Endpoints: eps}})
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Dests[0]
	if d.Endpoints[19] != (EndpointLoad{1, 1, 0}) || d.Endpoints[0] != (EndpointLoad{1, 0, 0}) || d.Stale.Tracked != 1 {
		t.Errorf("long list: last %+v, first %+v, stale %+v; want 1 active, 1 closing, 1 stale", d.Endpoints[19], d.Endpoints[0], d.Stale)
	}
}

// TestCountActive: Count reports the active entries per endpoint beside
// the tracked ones.
func TestCountActive(t *testing.T) {
	var lt loadTable
	lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadA)
	lt.add(unix.IPPROTO_TCP, tcpTimeWait, loadVIP, loadA)
	lt.add(unix.IPPROTO_TCP, tcpTimeWait, loadVIP, loadB)
	k := &fakeKernel{t: t, entries: lt.entries}
	counts, err := k.cleaner().Count(testCtx(t), loadServing()[:1])
	if err != nil {
		t.Fatal(err)
	}
	a, b := loadA.Addr(), loadB.Addr()
	if c := counts[0]; c.ByEndpoint[a] != 2 || c.Active[a] != 1 || c.ByEndpoint[b] != 1 || c.Active[b] != 0 || len(c.Active) != 1 {
		t.Errorf("Count = %+v; want a 2 (1 active), b 1 (0 active)", c)
	}
}

// TestTallyAllocatesNothingPerEntry counts a datagram's worth of entries,
// wanted and not, without allocating.
func TestTallyAllocatesNothingPerEntry(t *testing.T) {
	var lt loadTable
	for i := range 200 {
		switch i % 4 {
		case 0:
			lt.add(unix.IPPROTO_TCP, tcpEstablished, loadVIP, loadA)
		case 1:
			lt.add(unix.IPPROTO_TCP, tcpTimeWait, netip.AddrPortFrom(fakeNode, 30080), loadB)
		case 2:
			lt.add(unix.IPPROTO_UDP, 0, netip.AddrPortFrom(loadVIP.Addr(), 53), loadB)
		default:
			lt.add(unix.IPPROTO_TCP, tcpEstablished, netip.MustParseAddrPort("10.96.0.21:80"), loadA)
		}
	}
	var payloads [][]byte
	for _, e := range lt.entries {
		payloads = append(payloads, e.payload())
	}
	serving := loadServing()
	var idx destIndex
	idx.build(serving)
	tl := newTally(serving, &idx, newReport(serving))
	tl.seen, tl.compare = []uint32{1, 5, 9}, true
	tl.ids = make([]uint32, 0, len(payloads))
	allocs := testing.AllocsPerRun(20, func() {
		tl.ids = tl.ids[:0]
		for _, p := range payloads {
			tl.visit(p)
		}
	})
	if allocs != 0 {
		t.Errorf("counting %d entries allocated %.0f times; want 0", len(payloads), allocs)
	}
	if tl.bad != nil || tl.rep.Dests[0].Endpoints[0].Active == 0 {
		t.Errorf("counted nothing: %v, %+v", tl.bad, tl.rep.Dests[0])
	}
}
