// Package conntrack deletes the connection-tracking entries that would keep
// sending UDP and SCTP traffic the wrong way after a service changes.
//
// Connection tracking decides a flow's NAT once, on its first packet; later
// packets of the same 5-tuple reuse that decision for as long as the entry
// lives, and a client that keeps its source port (a DNS resolver, say) keeps
// the entry alive forever. Two changes leave entries that are wrong from then
// on, exactly the cases kube-proxy cleans up:
//
//   - An endpoint goes away: entries whose original destination is a service
//     address and port (or a node port) and whose reply comes from the removed
//     endpoint keep sending the client's datagrams to a dead address.
//   - A service gets its first endpoint: while it had none, a datagram that
//     got through un-NATed (routed on before the VIP had any rule) left an
//     entry with no NAT at all, which keeps bypassing the new DNAT rules. A
//     datagram dropped or rejected in a filter hook leaves no entry: the
//     kernel keeps an entry only once its first packet clears every hook.
//
// TCP is never cleared: its connections fail and reconnect on their own.
//
// StaleFlows computes the flows to clear from two states of a plan.Service;
// a Cleaner deletes the matching entries over ctnetlink, in the network
// namespace it was created for, without the conntrack binary.
//
// # Cost
//
// One Clear call reads the conntrack table once: a single dump of all address
// families (AF_UNSPEC), streamed through a fixed 64 KiB buffer and filtered in
// Go against an index of the requested flows, so the work is one pass over
// the table however many flows are asked for. Matching entries are then
// deleted by their exact original tuple, zone and conntrack ID (so an entry
// recreated since the dump is left alone), in batches of up to 64 delete
// requests per system call. The kernel cannot do the filtering itself: a
// ctnetlink flush accepts only mark and zone filters, and filtered dumps
// (CTA_FILTER) refuse AF_UNSPEC, so they would take one dump per address
// family and protocol, each walking the whole table.
//
// # Live load
//
// A Load reads, per service endpoint, the connections open through the
// service (TCP entries opening or established, every UDP and SCTP entry)
// and those opened since an earlier read, recognised by their conntrack
// IDs. Each read is the same single filtered dump, allocating nothing per
// entry, and stops at a number of entries and a time (Limits), saying so
// in its report. Count gives weir diagnose the same counts for one read.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// Flow selects conntrack entries to delete.
//
// An entry matches when its protocol is Protocol, its original destination
// is Dest (any destination address at Dest's port when Dest.Addr() is the
// zero Addr, as for node ports) and, if Endpoint is set, its reply comes from
// Endpoint, i.e. the entry was DNATed to that endpoint.
type Flow struct {
	// Protocol is plan.UDP or plan.SCTP.
	Protocol plan.Protocol
	// Dest is the original destination: a service address and port, or a
	// zero address with a node port, which matches every destination
	// address at that port (like kube-proxy, the Cleaner does not check
	// that the address is the node's).
	Dest netip.AddrPort
	// Endpoint, when valid, limits the flow to entries DNATed to it.
	Endpoint netip.Addr
}

// String formats the flow as "UDP 10.96.0.10:53 -> 10.244.1.5", with "*" for
// a zero destination address and without the arrow when Endpoint is unset.
func (f Flow) String() string {
	dest := "*:" + strconv.Itoa(int(f.Dest.Port()))
	if f.Dest.Addr().IsValid() {
		dest = f.Dest.String()
	}
	s := string(f.Protocol) + " " + dest
	if f.Endpoint.IsValid() {
		s += " -> " + f.Endpoint.String()
	}
	return s
}

// validate reports why the flow cannot be cleared, naming it.
func (f Flow) validate() error {
	switch {
	case protoNumber(f.Protocol) == 0:
		return fmt.Errorf("conntrack: flow %s: protocol must be UDP or SCTP", f)
	case f.Dest.Port() == 0:
		return fmt.Errorf("conntrack: flow %s: destination port is 0", f)
	case f.Dest.Addr().IsValid() && f.Endpoint.IsValid() && f.Dest.Addr().Unmap().Is4() != f.Endpoint.Unmap().Is4():
		return fmt.Errorf("conntrack: flow %s: destination and endpoint are of different IP families", f)
	}
	return nil
}

// protoNumber returns the IP protocol number of the protocols a Cleaner
// clears, and 0 for any other (TCP included).
func protoNumber(p plan.Protocol) uint8 {
	switch p {
	case plan.UDP:
		return unix.IPPROTO_UDP
	case plan.SCTP:
		return unix.IPPROTO_SCTP
	}
	return 0
}

// Cleaner deletes conntrack entries in one network namespace.
//
// A Cleaner is safe for concurrent use: every Clear opens its own netlink
// socket, so an aborted call leaves nothing behind for the next.
type Cleaner struct {
	log  *slog.Logger
	dial func(nsFd int) (*conn, error) // replaced in tests by a fake kernel

	mu     sync.Mutex
	nsFd   int // a private duplicate of the namespace fd; -1 for the caller's
	closed bool
}

// New returns a Cleaner for the network namespace netnsFd refers to, or for
// the caller's own namespace when netnsFd is 0.
//
// New duplicates netnsFd, so the caller may close its own descriptor. With
// 0 the Cleaner never switches namespaces: each Clear works in the
// namespace of the thread it runs on, which in a Go program is the
// process's. New opens one netlink socket to check the namespace and the
// privileges (CAP_NET_ADMIN; CAP_SYS_ADMIN too for another namespace). A
// nil log discards the Cleaner's messages.
func New(netnsFd int, log *slog.Logger) (*Cleaner, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cleaner{log: log, dial: dial, nsFd: -1}
	if netnsFd != 0 {
		fd, err := unix.FcntlInt(uintptr(netnsFd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("conntrack: namespace fd %d: %w", netnsFd, err)
		}
		c.nsFd = fd
	}
	conn, err := c.open()
	if err != nil {
		c.Close()
		return nil, err
	}
	conn.close()
	return c, nil
}

// Close releases the Cleaner's namespace descriptor; later Clear calls fail.
// Close is idempotent.
func (c *Cleaner) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.nsFd >= 0 {
		return unix.Close(c.nsFd)
	}
	return nil
}

// open dials a netlink socket in the Cleaner's namespace.
func (c *Cleaner) open() (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("conntrack: cleaner is closed")
	}
	return c.dial(c.nsFd)
}

// Clear deletes the conntrack entries matching any of flows and returns how
// many it deleted.
//
// It reads the conntrack table once, whatever the number of flows, and does
// nothing when flows is empty. An invalid flow (TCP, port 0, mixed families)
// is reported in the error and skipped; the others are still cleared. An
// entry that disappears before it is deleted is not an error. Errors name
// the flow and the entry concerned. ctx bounds the whole call.
func (c *Cleaner) Clear(ctx context.Context, flows []Flow) (deleted int, err error) {
	idx, errs := newIndex(flows)
	if idx.empty() {
		return 0, errors.Join(errs...)
	}
	pick := func(e *entry) (string, bool) { return idx.pick(e, flows) }
	n, serrs := c.sweep(ctx, describe(flows), idx.wants, pick)
	return n.Total(), joinCapped(append(errs, serrs...))
}

// sweep reads the conntrack table once and deletes the entries whose
// original tuple wanted accepts and that pick then selects; what names the
// request in messages.
func (c *Cleaner) sweep(ctx context.Context, what string, wanted func(tuple) bool, pick func(*entry) (string, bool)) (Deleted, []error) {
	start := time.Now()
	conn, err := c.open()
	if err != nil {
		return Deleted{}, []error{err}
	}
	defer conn.close()
	release, err := conn.bind(ctx)
	if err != nil {
		return Deleted{}, []error{err}
	}
	defer release()

	var matches []match
	var malformed error
	scanned := 0
	interrupted, err := conn.dump(func(b []byte) {
		scanned++
		m, ok, err := selectEntry(b, wanted, pick)
		switch {
		case err != nil && malformed == nil:
			malformed = fmt.Errorf("conntrack: skipped an unreadable entry: %w", err)
		case ok:
			matches = append(matches, m)
		}
	})
	if err != nil {
		return Deleted{}, []error{fmt.Errorf("conntrack: dump for %s: %w", what, ctxErr(ctx, err))}
	}
	var errs []error
	if interrupted {
		// The table changed under the dump and entries may have been
		// missed; what was read is still cleared.
		c.log.Warn("conntrack dump interrupted by concurrent changes; some stale entries may remain", "flows", what)
	}
	if malformed != nil {
		errs = append(errs, malformed)
	}
	deleted, derrs := conn.deleteAll(matches, what)
	for _, e := range derrs {
		errs = append(errs, ctxErr(ctx, e))
	}
	c.log.Debug("cleared stale conntrack entries", "flows", what, "scanned", scanned,
		"matched", len(matches), "deleted", deleted.Total(), "took", time.Since(start))
	return deleted, errs
}

// ctxErr names the context's error in an error its deadline or
// cancellation caused. The socket's deadline may fire a moment before the
// context's own timer, so a passed deadline counts too.
func ctxErr(ctx context.Context, err error) error {
	if !errors.Is(err, errDeadline) {
		return err
	}
	ce := ctx.Err()
	if d, ok := ctx.Deadline(); ce == nil && ok && !time.Now().Before(d) {
		ce = context.DeadlineExceeded
	}
	if ce == nil {
		return err
	}
	return fmt.Errorf("%w: %w", ce, err)
}

// maxErrors bounds the errors one Clear call reports individually.
const maxErrors = 8

// joinCapped joins errs, summarising all but the first few.
func joinCapped(errs []error) error {
	if len(errs) > maxErrors {
		more := fmt.Errorf("conntrack: and %d more errors", len(errs)-maxErrors)
		errs = append(errs[:maxErrors:maxErrors], more)
	}
	return errors.Join(errs...)
}

// describe names flows for messages, eliding long lists.
func describe(flows []Flow) string {
	const show = 4
	s := ""
	for i, f := range flows {
		if i == show {
			return s + fmt.Sprintf(" and %d more", len(flows)-show)
		}
		if i > 0 {
			s += ", "
		}
		s += f.String()
	}
	return s
}
