package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// TCP connection-tracking states (enum tcp_conntrack) of a connection
// opening or open: what Active counts.
const (
	tcpSynSent     = 1
	tcpSynRecv     = 2
	tcpEstablished = 3
)

// The default Limits of a Load. A read costs about 2 µs per entry on a
// 2-CPU machine, half of it the kernel's (docs/performance.md): 256Ki
// entries, the table size of a typical node (nf_conntrack_max), is about
// half a second of CPU and 1 MiB of remembered IDs; MaxTime stops a read
// that a loaded machine slows further. The dump comes in hash-bucket
// order, so the entries a truncated read counts are a sample spread over
// every endpoint, and ratios between endpoints still hold.
const (
	DefaultMaxEntries = 1 << 18
	DefaultMaxTime    = 500 * time.Millisecond
)

// Limits bounds the cost of one Load.Read.
type Limits struct {
	// MaxEntries is the most entries one read takes from the table,
	// wanted or not, and so bounds the IDs a Load keeps. 0 means
	// DefaultMaxEntries; negative, no limit.
	MaxEntries int
	// MaxTime is the longest one read lasts. 0 means DefaultMaxTime;
	// negative, no limit but the context's.
	MaxTime time.Duration
}

// EndpointLoad counts the conntrack entries whose replies come from one
// endpoint: the connections DNATed to it.
type EndpointLoad struct {
	// Tracked counts the entries in any state, closing ones included.
	Tracked int
	// Active counts the connections opening or open: TCP entries in
	// SYN_SENT, SYN_RECV or ESTABLISHED, and every UDP and SCTP entry.
	Active int
	// New counts the entries, in any state, that the complete read New is
	// counted from did not see: the connections opened since, whether
	// still open or not.
	New int
}

// DestLoad is the load on one destination of a Read's serving list.
type DestLoad struct {
	// Endpoints has one element per address of the Serving's Endpoints,
	// in the same order.
	Endpoints []EndpointLoad
	// Stale counts the entries whose replies come from no serving
	// endpoint, and StaleFrom lists up to 10 of those addresses.
	Stale     EndpointLoad
	StaleFrom []netip.Addr
}

// maxStaleFrom bounds DestLoad.StaleFrom.
const maxStaleFrom = 10

// LoadReport is what one Read found.
type LoadReport struct {
	// Dests has one element per element of the serving list, in order.
	Dests []DestLoad
	// Examined counts the entries read from the table, wanted or not.
	Examined int
	// Truncated reports that the read stopped at a limit before the end
	// of the table: the counts cover the entries read, and are lower
	// bounds.
	Truncated bool
	// Since is when the complete read New counts from started. It is the
	// zero time when there is none yet (the first read, or every read so
	// far truncated), and New is then zero everywhere.
	Since time.Time
	// Took is how long the read took.
	Took time.Duration
}

// Load reads the live load on service endpoints from the conntrack table,
// read after read: per endpoint, the connections open and those opened
// since an earlier read.
//
// Each Read is one dump of the table, filtered in Go, that stops at the
// Limits. Between reads a Load keeps only the conntrack IDs of the last
// complete read's wanted entries, as a sorted []uint32, so its memory is
// bounded by the entries a read may take (4 bytes each, twice). A Load is
// not safe for concurrent use.
type Load struct {
	c      *Cleaner
	limits Limits

	seen    []uint32  // sorted IDs of the wanted entries of the last complete read
	seenAt  time.Time // when that read started; zero: none yet
	scratch []uint32  // reused for the IDs of the read in progress
	idx     destIndex // reused between reads
}

// NewLoad returns a Load reading the table of c's namespace within limits.
func NewLoad(c *Cleaner, limits Limits) *Load {
	if limits.MaxEntries == 0 {
		limits.MaxEntries = DefaultMaxEntries
	}
	if limits.MaxTime == 0 {
		limits.MaxTime = DefaultMaxTime
	}
	return &Load{c: c, limits: limits}
}

// Read reads the table once and counts, for each destination of serving,
// the entries whose original destination it is, by the endpoint their
// replies come from.
//
// A read cut short by the Limits is no error: it says so in Truncated.
// ctx's own end is an error, and leaves the Load as it was.
func (l *Load) Read(ctx context.Context, serving []Serving) (*LoadReport, error) {
	start := time.Now()
	l.idx.build(serving)
	rep := newReport(serving)
	t := newTally(serving, &l.idx, rep)
	t.max = max(l.limits.MaxEntries, 0)
	t.ids = l.scratch[:0]
	if !l.seenAt.IsZero() {
		t.seen, t.compare, rep.Since = l.seen, true, l.seenAt
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if l.limits.MaxTime > 0 {
		rctx, cancel = context.WithTimeout(ctx, l.limits.MaxTime)
	}
	defer cancel()
	err := t.run(rctx, l.c)
	rep.Took = time.Since(start)
	l.scratch = t.ids
	if err != nil && !budgetSpent(ctx, rctx, err) {
		return nil, fmt.Errorf("conntrack: read the load: %w", ctxErr(ctx, err))
	}
	rep.Truncated = rep.Truncated || err != nil
	if !rep.Truncated {
		slices.Sort(t.ids)
		l.seen, l.scratch, l.seenAt = t.ids, l.seen[:0], start
	}
	return rep, nil
}

// budgetSpent reports whether err is the read's own deadline (rctx's, from
// MaxTime) passing while the caller's ctx still runs.
func budgetSpent(ctx, rctx context.Context, err error) bool {
	if !errors.Is(err, errDeadline) || ctx.Err() != nil {
		return false
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return false
	}
	d, ok := rctx.Deadline()
	return ok && !time.Now().Before(d)
}

// newReport returns a report with zero counts for each of serving, the
// endpoints' counters all in one allocation.
func newReport(serving []Serving) *LoadReport {
	n := 0
	for _, s := range serving {
		n += len(s.Endpoints)
	}
	flat := make([]EndpointLoad, n)
	rep := &LoadReport{Dests: make([]DestLoad, len(serving))}
	for i, s := range serving {
		rep.Dests[i].Endpoints, flat = flat[:len(s.Endpoints):len(s.Endpoints)], flat[len(s.Endpoints):]
	}
	return rep
}

// tally counts one read's entries into a report.
type tally struct {
	serving []Serving
	idx     *destIndex
	rep     *LoadReport
	max     int      // entries to read at most; 0: no limit
	seen    []uint32 // the IDs New is counted against, when compare
	compare bool
	ids     []uint32 // the IDs of this read's wanted entries
	dest    int32    // where the entry being parsed goes, set by wanted
	wanted  func(tuple) bool
	bad     error // the first unreadable entry's error
}

// newTally returns a tally of the entries to serving's destinations.
func newTally(serving []Serving, idx *destIndex, rep *LoadReport) *tally {
	t := &tally{serving: serving, idx: idx, rep: rep}
	t.wanted = func(o tuple) bool {
		d, ok := t.idx.find(o)
		t.dest = d
		return ok
	}
	return t
}

// run reads the table of c's namespace once into the tally.
func (t *tally) run(ctx context.Context, c *Cleaner) error {
	conn, err := c.open()
	if err != nil {
		return err
	}
	defer conn.close()
	release, err := conn.bind(ctx)
	if err != nil {
		return err
	}
	defer release()
	interrupted, _, err := conn.dumpUntil(t.visit)
	if interrupted {
		c.log.Warn("conntrack dump interrupted by concurrent changes; the load counts may miss entries")
	}
	if t.bad != nil {
		c.log.Warn("conntrack: skipped unreadable entries while counting the load", "err", t.bad)
	}
	return err
}

// visit counts one dump message; it returns false to stop at the limit.
func (t *tally) visit(b []byte) bool {
	if t.max > 0 && t.rep.Examined == t.max {
		t.rep.Truncated = true
		return false
	}
	t.rep.Examined++
	e, ok, err := parseEntry(b, t.wanted)
	if err != nil && t.bad == nil {
		t.bad = err
	}
	if ok {
		t.count(&e)
	}
	return true
}

// count adds one wanted entry to its destination's counters.
func (t *tally) count(e *entry) {
	d := &t.rep.Dests[t.dest]
	from := e.reply.src.Addr()
	slot := &d.Stale
	if j := t.idx.endpoint(t.serving, t.dest, from); j >= 0 {
		slot = &d.Endpoints[j]
	} else if len(d.StaleFrom) < maxStaleFrom && !slices.Contains(d.StaleFrom, from) {
		d.StaleFrom = append(d.StaleFrom, from)
	}
	slot.Tracked++
	if e.active() {
		slot.Active++
	}
	if !e.hasID {
		return
	}
	t.ids = append(t.ids, e.id)
	if _, found := slices.BinarySearch(t.seen, e.id); t.compare && !found {
		slot.New++
	}
}

// active reports whether the entry is a connection opening or open.
func (e *entry) active() bool {
	if e.orig.proto != unix.IPPROTO_TCP {
		return true
	}
	switch e.tcpState {
	case tcpSynSent, tcpSynRecv, tcpEstablished:
		return true
	}
	return false
}

// linearEndpoints is the longest endpoint list searched by a scan; longer
// ones are indexed in a map.
const linearEndpoints = 16

// destIndex finds the destination of a serving list an entry's original
// tuple goes to, and the endpoint its reply comes from. Its maps are kept
// between reads and cleared, so a periodic caller reuses their memory.
type destIndex struct {
	byDest     map[key]int32
	anyAddr    bool            // some destination has a zero address
	byEndpoint map[epKey]int32 // positions in long endpoint lists
}

// epKey is an endpoint address of one destination.
type epKey struct {
	dest int32
	addr netip.Addr
}

// build indexes serving; a destination listed twice counts as its last.
func (x *destIndex) build(serving []Serving) {
	if x.byDest == nil {
		x.byDest = make(map[key]int32, len(serving))
	}
	clear(x.byDest)
	clear(x.byEndpoint)
	x.anyAddr = false
	for i, s := range serving {
		k := key{proto: anyProtoNumber(s.Protocol), addr: s.Dest.Addr().Unmap(), port: s.Dest.Port()}
		x.byDest[k] = int32(i)
		x.anyAddr = x.anyAddr || !k.addr.IsValid()
		if len(s.Endpoints) > linearEndpoints {
			x.indexEndpoints(int32(i), s.Endpoints)
		}
	}
}

// indexEndpoints maps the addresses of a long endpoint list to their
// first positions.
func (x *destIndex) indexEndpoints(dest int32, eps []netip.Addr) {
	if x.byEndpoint == nil {
		x.byEndpoint = map[epKey]int32{}
	}
	for j, a := range eps {
		k := epKey{dest: dest, addr: a.Unmap()}
		if _, dup := x.byEndpoint[k]; !dup {
			x.byEndpoint[k] = int32(j)
		}
	}
}

// find returns the destination an original tuple goes to: its exact
// address and port, else a node port (zero address) at its port.
func (x *destIndex) find(t tuple) (int32, bool) {
	if i, ok := x.byDest[key{proto: t.proto, addr: t.dst.Addr(), port: t.dst.Port()}]; ok {
		return i, true
	}
	if !x.anyAddr {
		return -1, false
	}
	i, ok := x.byDest[key{proto: t.proto, port: t.dst.Port()}]
	return i, ok
}

// endpoint returns the position of from among the endpoints of serving's
// destination d, or -1.
func (x *destIndex) endpoint(serving []Serving, d int32, from netip.Addr) int {
	eps := serving[d].Endpoints
	if len(eps) > linearEndpoints {
		if j, ok := x.byEndpoint[epKey{dest: d, addr: from}]; ok {
			return int(j)
		}
		return -1
	}
	for j, a := range eps {
		if a.Unmap() == from {
			return j
		}
	}
	return -1
}
