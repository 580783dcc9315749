package ipvs

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

var (
	sigVS   = vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.TCP, port: 80}
	sigPodA = netip.MustParseAddrPort("10.244.0.11:8080")
	sigPodB = netip.MustParseAddrPort("10.244.0.12:8080")
)

func count(real netip.AddrPort, active uint32, conns uint64) destCount {
	return destCount{real: real, active: active, conns: conns, known: true}
}

// newOf returns the New of each real server of ds, as "addr:port" → n.
func newOf(ds []destSignals) map[netip.AddrPort]uint64 {
	out := map[netip.AddrPort]uint64{}
	for _, d := range ds {
		out[d.real] = d.new
	}
	return out
}

// TestCountersDelta follows one virtual server through readings: the
// first gives no New, a rise gives its size, a fall (counters zeroed) the
// whole new count, a real server that left and came back starts over,
// and a kernel without stats gives none.
func TestCountersDelta(t *testing.T) {
	var cs counters
	t0 := time.Unix(1000, 0)
	step := func(at time.Duration, counts ...destCount) map[netip.AddrPort]uint64 {
		t.Helper()
		ds, next := cs.compare(sigVS, counts, t0.Add(at))
		cs.store(map[vsKey]*serverCounts{sigVS: next})
		for i, d := range ds {
			if d.real != counts[i].real || d.active != counts[i].active {
				t.Errorf("reading %d: %s active %d, want %s active %d", i, d.real, d.active, counts[i].real, counts[i].active)
			}
		}
		return newOf(ds)
	}
	check := func(what string, got map[netip.AddrPort]uint64, want map[netip.AddrPort]uint64) {
		t.Helper()
		for a, n := range want {
			if got[a] != n {
				t.Errorf("%s: New of %s = %d, want %d", what, a, got[a], n)
			}
		}
	}
	check("first reading", step(0, count(sigPodA, 3, 500), count(sigPodB, 0, 7)),
		map[netip.AddrPort]uint64{sigPodA: 0, sigPodB: 0})
	check("rise", step(time.Second, count(sigPodA, 4, 505), count(sigPodB, 1, 7)),
		map[netip.AddrPort]uint64{sigPodA: 5, sigPodB: 0})
	check("zeroed counters", step(2*time.Second, count(sigPodA, 4, 2), count(sigPodB, 1, 9)),
		map[netip.AddrPort]uint64{sigPodA: 2, sigPodB: 2})
	check("B gone", step(3*time.Second, count(sigPodA, 4, 2)), map[netip.AddrPort]uint64{sigPodA: 0})
	check("B back: a first reading again", step(4*time.Second, count(sigPodA, 0, 3), count(sigPodB, 0, 40)),
		map[netip.AddrPort]uint64{sigPodA: 1, sigPodB: 0})
	check("no stats", step(5*time.Second, destCount{real: sigPodA, active: 1}, count(sigPodB, 0, 41)),
		map[netip.AddrPort]uint64{sigPodA: 0, sigPodB: 1})
	check("stats again", step(6*time.Second, count(sigPodA, 0, 9)), map[netip.AddrPort]uint64{sigPodA: 0})
	check("huge rise", step(7*time.Second, count(sigPodA, 0, 9+1<<40)), map[netip.AddrPort]uint64{sigPodA: 1 << 40})
}

// TestCountersUncommittedReadingChangesNothing: a reading compared but
// not stored (its Signals call failed) leaves the next delta counted from
// the stored one.
func TestCountersUncommittedReadingChangesNothing(t *testing.T) {
	var cs counters
	now := time.Unix(1000, 0)
	_, first := cs.compare(sigVS, []destCount{count(sigPodA, 0, 10)}, now)
	cs.store(map[vsKey]*serverCounts{sigVS: first})
	cs.compare(sigVS, []destCount{count(sigPodA, 0, 15)}, now.Add(time.Second))
	ds, _ := cs.compare(sigVS, []destCount{count(sigPodA, 0, 18)}, now.Add(2*time.Second))
	if got := newOf(ds)[sigPodA]; got != 8 {
		t.Errorf("New = %d, want 8 (from the stored 10)", got)
	}
}

// TestCountersSweep forgets virtual servers unread for signalRetention,
// sweeping at most once every signalSweepEvery.
func TestCountersSweep(t *testing.T) {
	var cs counters
	t0 := time.Unix(1000, 0)
	other := vsKey{addr: netip.MustParseAddr("172.30.0.1"), proto: plan.TCP, port: 30080}
	_, a := cs.compare(sigVS, []destCount{count(sigPodA, 0, 1)}, t0)
	_, b := cs.compare(other, []destCount{count(sigPodA, 0, 1)}, t0.Add(time.Hour))
	cs.store(map[vsKey]*serverCounts{sigVS: a, other: b})
	cs.sweep(t0.Add(signalRetention))
	if len(cs.byServer) != 2 {
		t.Fatalf("swept at exactly the retention: %d left", len(cs.byServer))
	}
	cs.sweep(t0.Add(signalRetention + time.Second))
	if len(cs.byServer) != 2 {
		t.Fatalf("swept again within %s: %d left", signalSweepEvery, len(cs.byServer))
	}
	cs.sweep(t0.Add(signalRetention + signalSweepEvery))
	if cs.byServer[sigVS] != nil || cs.byServer[other] == nil {
		t.Errorf("after the retention: %v", cs.byServer)
	}
}

// TestSignalsOfSumsPerEndpoint sums an endpoint over the virtual servers
// of its service, aligned with the endpoints as listed, reads a virtual
// server once however many services share it, counts UDP's inactive
// flows as active, and saturates.
func TestSignalsOfSumsPerEndpoint(t *testing.T) {
	nodePort := vsKey{addr: netip.MustParseAddr("172.30.0.1"), proto: plan.TCP, port: 30080}
	dns := vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.UDP, port: 53}
	readings := map[vsKey][]destSignals{
		sigVS: {{real: sigPodA, active: 2, inactive: 9, new: 1}, {real: sigPodB, active: 1, new: 3}},
		nodePort: {{real: sigPodA, active: 1, new: 1}, {real: netip.MustParseAddrPort("10.244.0.99:8080"), active: 5},
			{real: sigPodB, active: math.MaxUint32, new: 1 << 33}},
		dns: {{real: netip.MustParseAddrPort("10.244.0.11:53"), active: 0, inactive: 4, new: 4}},
	}
	reads := map[vsKey]int{}
	read := func(k vsKey) ([]destSignals, error) {
		reads[k]++
		return readings[k], nil
	}
	web := service("web", plan.TCP, 80, 30080, nil, ep("10.244.0.12", 8080, 1), ep("10.244.0.13", 8080, 1),
		ep("::ffff:10.244.0.11", 8080, 1), ep("10.244.0.12", 8080, 1))
	udp := service("dns", plan.UDP, 53, 0, nil, ep("10.244.0.11", 53, 1))
	services := []*plan.Service{web, nil, udp, web}
	keys := [][]vsKey{{nodePort, sigVS}, nil, {dns}, {sigVS, nodePort}}
	got, err := signalsOf(context.Background(), services, keys, never, read)
	if err != nil {
		t.Fatal(err)
	}
	wantWeb := []abi.Signals{{Active: math.MaxUint32, New: math.MaxUint32}, {}, {Active: 3, New: 2}, {}}
	want := [][]abi.Signals{wantWeb, nil, {{Active: 4, New: 4}}, wantWeb}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("service %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for k, n := range reads {
		if n != 1 {
			t.Errorf("%s read %d times", k, n)
		}
	}
}

// TestSignalsOfStops returns the first error of a read, and stops before
// reading once ctx is done.
func TestSignalsOfStops(t *testing.T) {
	web := service("web", plan.TCP, 80, 0, nil, ep("10.244.0.11", 8080, 1))
	boom := errors.New("boom")
	_, err := signalsOf(context.Background(), []*plan.Service{web}, [][]vsKey{{sigVS}}, never,
		func(vsKey) ([]destSignals, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Errorf("read error: got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = signalsOf(ctx, []*plan.Service{web}, [][]vsKey{{sigVS}}, never, func(vsKey) ([]destSignals, error) {
		t.Error("read after ctx was done")
		return nil, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("done ctx: got %v", err)
	}
}

// never is a budget that is never spent.
func never() bool { return false }

// TestSignalsOfBudget leaves the services not begun when the budget is
// spent unread (nil), and finishes the one under way.
func TestSignalsOfBudget(t *testing.T) {
	web := service("web", plan.TCP, 80, 30080, nil, ep("10.244.0.11", 8080, 1))
	dns := service("dns", plan.UDP, 53, 0, nil, ep("10.244.0.11", 53, 1))
	nodePort := vsKey{addr: netip.MustParseAddr("172.30.0.1"), proto: plan.TCP, port: 30080}
	dnsVS := vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.UDP, port: 53}
	reads := 0
	got, err := signalsOf(context.Background(), []*plan.Service{web, dns}, [][]vsKey{{sigVS, nodePort}, {dnsVS}},
		func() bool { return reads > 0 }, func(vsKey) ([]destSignals, error) {
			reads++
			return nil, nil
		})
	if err != nil || got[0] == nil || got[1] != nil || reads != 2 {
		t.Errorf("got %v after %d reads (%v); want web read through its two virtual servers, dns left nil", got, reads, err)
	}
}

// TestServerKeysAreTheSyncedOnes gives each service the virtual servers
// the backend's state holds for its key: cluster IP, node ports, external
// IPs and the short circuit's firewall marks; none for one not synced.
func TestServerKeysAreTheSyncedOnes(t *testing.T) {
	web := service("web", plan.TCP, 80, 30080, []string{"10.96.0.10"}, ep("10.244.0.11", 8080, 1))
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	web.ExternalLocal = true
	nodeAddrs := []netip.Addr{netip.MustParseAddr("172.30.0.1"), netip.MustParseAddr("172.31.0.1")}
	st := desiredService(web, nodeAddrs, "rr", markBase)
	b := &Backend{}
	b.setServices(map[plan.Key]*serviceState{web.Key: st})
	other := service("other", plan.TCP, 80, 0, []string{"10.96.0.11"})
	got := b.serverKeys([]*plan.Service{web, other, nil})
	want := []string{"FWM 65536 IPv4", "TCP 10.96.0.10:80", "TCP 172.30.0.1:30080", "TCP 172.31.0.1:30080", "TCP 192.0.2.7:80"}
	var names []string
	for _, k := range got[0] {
		names = append(names, k.String())
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("web: %v, want %v", names, want)
	}
	if got[1] != nil || got[2] != nil {
		t.Errorf("unsynced and nil services: %v %v", got[1], got[2])
	}
}

// TestServerKeysAlongsideSync reads services' virtual servers while
// another goroutine stores their states, as Signals does beside a sync
// (the race detector checks the locking).
func TestServerKeysAlongsideSync(t *testing.T) {
	web := service("web", plan.TCP, 80, 30080, []string{"10.96.0.10"}, ep("10.244.0.11", 8080, 1))
	st := desiredService(web, []netip.Addr{netip.MustParseAddr("172.30.0.1")}, "rr", 0)
	b := &Backend{}
	b.setServices(map[plan.Key]*serviceState{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			if i%2 == 0 {
				b.setService(web.Key, st)
			} else {
				b.setService(web.Key, nil)
			}
		}
		b.setServices(map[plan.Key]*serviceState{web.Key: st})
	}()
	for {
		select {
		case <-done:
			if got := b.serverKeys([]*plan.Service{web})[0]; len(got) != 2 {
				t.Errorf("after the last store: %v", got)
			}
			return
		default:
			if got := b.serverKeys([]*plan.Service{web})[0]; len(got) != 0 && len(got) != 2 {
				t.Fatalf("read a half-stored state: %v", got)
			}
		}
	}
}
