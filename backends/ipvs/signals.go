package ipvs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// Live-load signals (issue 19) in IPVS mode come from IPVS's own counts
// per real server, not from the conntrack table: the number of active
// (and inactive) connections, kept exactly as connections change state,
// and the cumulative number of connections scheduled, which the kernel's
// rate estimator refreshes every two seconds.

const (
	// signalRetention is how long the counters of a virtual server that
	// Signals stops reading are kept: twice the longest interval at which
	// hooks reads signals (one hour), so that a plugin read rarely, in
	// calls that otherwise cover other plugins' services, still sees the
	// connections opened between its readings.
	signalRetention = 2 * time.Hour
	// signalSweepEvery is how often the counters are swept of those
	// older than signalRetention.
	signalSweepEvery = time.Minute
	// signalBudget bounds one Signals call, as conntrack.DefaultMaxTime
	// bounds a reading of the conntrack table: the services not begun
	// when it is spent are left unread (nil), for a later call.
	signalBudget = 500 * time.Millisecond
)

// Signals returns, for each service, the live signals of its endpoints,
// aligned with services[i].Endpoints; it is the hooks.SignalSource of IPVS
// mode.
//
// The virtual servers of a service are those the last sync programmed
// for its key: one per cluster, external and load-balancer IP on its
// port and per node-port address on its node port, and its short-circuit
// firewall-mark virtual servers; a service not synced yet has none and
// reads as zeros. An endpoint is the real server of its address and port
// in each, and its signals are summed over them:
//
//   - Active is IPVS's count of active connections (TCP and SCTP ones in
//     the ESTABLISHED state). For UDP it is the active and the inactive
//     count together: IPVS counts every UDP flow as inactive, so a UDP
//     endpoint's flows not yet timed out (IPVS's UDP timeout, 300 s by
//     default) are its active connections, as in the conntrack source.
//   - New is the rise of IPVS's cumulative count of connections scheduled
//     to the real server since the previous successful Signals call that
//     read the virtual server (a call that fails changes no counter): 0 at
//     the first reading, and the whole count when it fell (the counters
//     were zeroed, or the real server was recreated).
//     The kernel's estimator refreshes that count every two seconds, so
//     New lags the connections by up to two seconds (they show in the next
//     reading), and with the sysctl net.ipv4.vs.run_estimation at 0 the
//     count stays still and New stays 0.
//
// An endpoint listed twice gets its signals at its first position only.
// The cost is one generic netlink dump per virtual server of the services
// asked (each read once per call, however many services share it), no
// more, and at most signalBudget: the services not begun by then get nil,
// which hooks.Chain.Poll takes as not read (their counters stay, so the
// next reading of them counts New from their last one). Signals is safe to call from any goroutine, alongside Sync: it
// reads the services' virtual servers under a lock of their own that a
// sync holds only to store a service's new state, and the kernel through
// a socket of its own; concurrent Signals calls take turns. The counters
// it keeps are those of the virtual servers it read in the last two hours.
func (b *Backend) Signals(ctx context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	keys := b.serverKeys(services)
	r := &b.signals
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.open(b.opts.NetNS, b.genl.family)
	if err != nil {
		return nil, err
	}
	now := b.now()
	start := time.Now()
	spent := func() bool { return time.Since(start) > signalBudget }
	read := map[vsKey]*serverCounts{}
	out, err := signalsOf(ctx, services, keys, spent, func(k vsKey) ([]destSignals, error) {
		counts, err := readCounts(c, k)
		if err != nil {
			return nil, err
		}
		ds, next := r.counters.compare(k, counts, now)
		read[k] = next
		return ds, nil
	})
	if err != nil {
		// The counters stay as they were: the next call counts from
		// there. A socket that failed mid-dump may hold the rest of the
		// answer: the next call opens a fresh one.
		if ctx.Err() == nil {
			r.drop()
		}
		return nil, err
	}
	r.counters.store(read)
	r.counters.sweep(now)
	return out, nil
}

// signalsOf returns the signals of services' endpoints, keys[i] being the
// virtual servers of services[i], from read, which it calls once per
// virtual server, checking ctx before each call. Once spent reports the
// budget spent, the services not begun are left nil.
func signalsOf(ctx context.Context, services []*plan.Service, keys [][]vsKey, spent func() bool,
	read func(vsKey) ([]destSignals, error)) ([][]abi.Signals, error) {
	readings := map[vsKey][]destSignals{}
	out := make([][]abi.Signals, len(services))
	for i, svc := range services {
		if svc == nil || spent() {
			continue
		}
		out[i] = make([]abi.Signals, len(svc.Endpoints))
		at := endpointIndex(svc)
		for _, k := range keys[i] {
			ds, ok := readings[k]
			if !ok {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				var err error
				if ds, err = read(k); err != nil {
					return nil, err
				}
				readings[k] = ds
			}
			for _, d := range ds {
				if j, ok := at[d.real]; ok {
					addSignals(&out[i][j], d, svc.Key.Protocol)
				}
			}
		}
	}
	return out, nil
}

// serverKeys returns the keys of each service's virtual servers as the
// last sync programmed them (none for a nil service or one not synced).
func (b *Backend) serverKeys(services []*plan.Service) [][]vsKey {
	b.view.RLock()
	defer b.view.RUnlock()
	out := make([][]vsKey, len(services))
	for i, svc := range services {
		if svc != nil {
			out[i] = b.services[svc.Key].keys()
		}
	}
	return out
}

// endpointIndex returns the position of each of svc's endpoints, by
// address and port; the first, for one listed twice.
func endpointIndex(svc *plan.Service) map[netip.AddrPort]int {
	at := make(map[netip.AddrPort]int, len(svc.Endpoints))
	for j, e := range svc.Endpoints {
		ap := netip.AddrPortFrom(e.Address.Unmap(), e.Port)
		if _, dup := at[ap]; !dup {
			at[ap] = j
		}
	}
	return at
}

// addSignals adds one real server's reading to an endpoint's signals,
// saturating; proto is the service's.
func addSignals(s *abi.Signals, d destSignals, proto plan.Protocol) {
	active := uint64(d.active)
	if proto == plan.UDP {
		active += uint64(d.inactive)
	}
	s.Active = satAdd(s.Active, active)
	s.New = satAdd(s.New, d.new)
}

func satAdd(a uint32, b uint64) uint32 {
	return uint32(min(uint64(a)+b, math.MaxUint32))
}

// destCount is one real server's counts as the kernel reports them.
type destCount struct {
	real             netip.AddrPort
	active, inactive uint32
	// conns is the cumulative count of connections scheduled to it;
	// known is false when the kernel sent none.
	conns uint64
	known bool
}

// destSignals is one real server's reading: its connection counts and
// the connections scheduled to it since the previous reading.
type destSignals struct {
	real             netip.AddrPort
	active, inactive uint32
	new              uint64
}

// readCounts dumps the real servers of the virtual server k with their
// counts; a virtual server the kernel does not have has none.
func readCounts(c *genlConn, k vsKey) ([]destCount, error) {
	var out []destCount
	err := c.dumpDests(k, func(attrs []attr) {
		d := destFromAttrs(attrs, family(k.addr))
		a, ok := fromDestination(d)
		if !ok {
			return
		}
		conns, known := scheduledConns(attrs)
		out = append(out, destCount{real: a, active: clampCount(d.ActiveConnections),
			inactive: clampCount(d.InactiveConnections), conns: conns, known: known})
	})
	if err = ignoreGone(err); err != nil {
		return nil, fmt.Errorf("ipvs: read the counts of virtual server %s: %w", k, err)
	}
	return out, nil
}

// clampCount returns a kernel count (an unsigned 32-bit number decoded as
// an int) as a uint32.
func clampCount(n int) uint32 { return uint32(max(0, min(n, math.MaxUint32))) }

// signalReader is what Signals keeps between calls, guarded by mu: a
// generic netlink socket of its own (the sync's serves one caller at a
// time), opened at the first call, and the counters it last read.
type signalReader struct {
	mu       sync.Mutex
	conn     *genlConn
	closed   bool
	counters counters
}

// open returns the reader's socket, opening it in the network namespace
// fd for the IPVS family fam at the first call.
func (r *signalReader) open(fd int, fam uint16) (*genlConn, error) {
	if r.closed {
		return nil, errors.New("ipvs: read signals: the backend is closed")
	}
	if r.conn == nil {
		c, err := dialGenl(fd, fam)
		if err != nil {
			return nil, err
		}
		r.conn = c
	}
	return r.conn, nil
}

// drop closes the socket, for the next call to open another.
func (r *signalReader) drop() {
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// close closes the socket; later Signals calls fail.
func (r *signalReader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop()
	r.closed = true
}

// counters holds, per virtual server, the cumulative connection counts
// of its real servers at its last reading.
type counters struct {
	byServer map[vsKey]*serverCounts
	swept    time.Time
}

// serverCounts is one virtual server's last reading.
type serverCounts struct {
	read  time.Time
	conns map[netip.AddrPort]uint64
}

// compare returns the signals of the real servers of the virtual server
// k from its reading counts, taken at now: the connections scheduled to
// each since the previous reading stored (see newConns), 0 for those it
// did not have. It returns the reading too, for store.
func (cs *counters) compare(k vsKey, counts []destCount, now time.Time) ([]destSignals, *serverCounts) {
	prev := cs.byServer[k]
	next := &serverCounts{read: now, conns: make(map[netip.AddrPort]uint64, len(counts))}
	out := make([]destSignals, len(counts))
	for i, d := range counts {
		out[i] = destSignals{real: d.real, active: d.active, inactive: d.inactive}
		if !d.known {
			continue
		}
		next.conns[d.real] = d.conns
		if prev != nil {
			if was, ok := prev.conns[d.real]; ok {
				out[i].new = newConns(was, d.conns)
			}
		}
	}
	return out, next
}

// store makes readings each virtual server's previous reading, in place
// of the one before (so real servers gone from it are forgotten).
func (cs *counters) store(readings map[vsKey]*serverCounts) {
	if cs.byServer == nil {
		cs.byServer = make(map[vsKey]*serverCounts, len(readings))
	}
	for k, s := range readings {
		cs.byServer[k] = s
	}
}

// newConns returns the connections scheduled between two readings of a
// cumulative count: its rise, or all of now when it fell (zeroed, or a
// real server recreated, since the first reading).
func newConns(was, now uint64) uint64 {
	if now < was {
		return now
	}
	return now - was
}

// sweep forgets, at most once every signalSweepEvery, the virtual
// servers not read for signalRetention.
func (cs *counters) sweep(now time.Time) {
	if now.Sub(cs.swept) < signalSweepEvery {
		return
	}
	cs.swept = now
	for k, s := range cs.byServer {
		if now.Sub(s.read) > signalRetention {
			delete(cs.byServer, k)
		}
	}
}
