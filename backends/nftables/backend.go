// Package nftables programs Weir's plan into the kernel with nf_tables over
// netlink (github.com/google/nftables; no nft binary at run time).
//
// Everything lives in one table per family, ip and ip6 (default name
// "weir"). The first full sync replaces the tables in one atomic
// transaction; later full syncs empty and refill every object, recreating
// what another process deleted, unless the ruleset generation shows that
// nothing committed since Weir's last commit (generation.go); a partial
// sync sends only the elements of the services that changed, also as one
// transaction. When a commit fails
// (most often because another process changed the tables), Sync at once
// rebuilds the tables from scratch, which also removes objects that are not
// Weir's. The backend remembers what it committed and never reads kernel
// state back on the sync path; ReadBack, for checking only, does.
package nftables

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// refillEvery bounds the time between two full syncs that write every
// object even though the generation shows nothing changed, as mode
// iptables rewrites hourly: a defect in Weir's own partial syncs would not
// outlive it.
const refillEvery = time.Hour

// Options configures the backend.
type Options struct {
	backends.Common
	// Table is the nftables table name; "weir" when empty.
	Table string
	// PlainBuckets leaves the endpoint buckets without the comment naming
	// their service port, which every other element of the port carries
	// (comments.go): a full sync at 10k services is about 8 % faster.
	PlainBuckets bool
}

var (
	_ backends.Backend          = (*Backend)(nil)
	_ backends.KubeProxyRemover = (*Backend)(nil)
)

// Backend is the nftables backend: one table per IP family, both changed in
// one transaction. It is safe for one caller at a time.
type Backend struct {
	mu sync.Mutex
	// kernel takes the commits: nf_tables over netlink (kernel.go).
	kernel kernel
	tables []*table // IPv4, then IPv6
	gen    genStamp
	// refilled is when the last full sync wrote every object.
	refilled time.Time
	opts     Options
	log      *slog.Logger
	// failed counts the failed commits of the Sync under way, report keeps
	// the figures of the latest (report.go).
	failed failures
	report backends.Report
}

// New returns a backend that programs the network namespace in opts.
func New(opts Options) (*Backend, error) {
	opts = opts.withDefaults()
	k, err := newNetlinkKernel(opts)
	if err != nil {
		return nil, err
	}
	return newBackend(opts, k), nil
}

// newBackend returns a backend that sends its commits to k.
func newBackend(opts Options, k kernel) *Backend {
	opts = opts.withDefaults()
	return &Backend{kernel: k, tables: newTables(opts), opts: opts, log: opts.Log}
}

// withDefaults fills in the table name and the logger.
func (o Options) withDefaults() Options {
	if o.Table == "" {
		o.Table = "weir"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// Sync makes the kernel match p; see backends.Backend.
func (b *Backend) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failed = failures{}
	defer func() { b.report = b.failed.report() }()
	if err := ctx.Err(); err != nil {
		return err
	}
	fromScratch := !b.tables[0].synced
	err = b.sync(p, req)
	if err == nil || fromScratch {
		return err
	}
	// The kernel refused a change against what Weir committed: most often
	// another process deleted or added something. Rebuilding from scratch
	// does not depend on what is there.
	if rerr := b.fullSync(p); rerr != nil {
		return fmt.Errorf("%w; rebuilding the tables from scratch failed too: %w", err, rerr)
	}
	b.log.Warn("nftables: a commit failed; rebuilt Weir's tables from scratch, and they match the plan again "+
		"(another process may have changed them; ClientIP affinity was reset)",
		"tables", "ip/ip6 "+b.opts.Table, "error", err)
	return nil
}

// sync commits p: a full sync when asked for, unless the generation shows
// the tables as Weir's last commit left them (then only what changed is
// written), or when the tables are not known to hold Weir's last commit; a
// partial one otherwise.
func (b *Backend) sync(p *plan.Plan, req backends.SyncRequest) error {
	switch {
	case !b.tables[0].synced || (req.Full && (!b.untouched() || time.Since(b.refilled) > refillEvery)):
		return b.fullSync(p)
	case req.Full:
		return b.partialSync(p, b.everyKey(p))
	}
	return b.partialSync(p, req.Changed)
}

// everyKey returns the plan's keys and those of every service committed.
func (b *Backend) everyKey(p *plan.Plan) []plan.Key {
	keys := p.Keys()
	for _, tb := range b.tables {
		for k := range tb.state.services {
			if p.Services[k] == nil {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

func (b *Backend) fullSync(p *plan.Plan) error {
	if !b.tables[0].synced && b.opts.LocalhostNodePorts {
		if err := b.kernel.routeLocalnet(); err != nil {
			b.log.Warn("Cannot enable route_localnet; NodePorts on 127.0.0.1 will not work", "error", err)
		}
	}
	var txns []*txn
	var pending []*changes
	out := b.kernel.batch()
	for _, tb := range b.tables {
		t, c := tb.fullTxn(p, out)
		txns, pending = append(txns, t), append(pending, c)
	}
	if err := b.commit(true, txns...); err != nil {
		return err
	}
	for i, tb := range b.tables {
		pending[i].commit()
		tb.state, tb.synced = pending[i].base, true
	}
	b.refilled = time.Now()
	return nil
}

func (b *Backend) partialSync(p *plan.Plan, changed []plan.Key) error {
	var txns []*txn
	var pending []*changes
	out := b.kernel.batch()
	for _, tb := range b.tables {
		t, c := tb.partialTxn(p, changed, out)
		pending = append(pending, c)
		if !t.empty() {
			txns = append(txns, t)
		}
	}
	if len(txns) > 0 {
		if err := b.commit(false, txns...); err != nil {
			return err
		}
	}
	// A table with nothing to send already holds what its changes describe
	// (a node IP that changed no service's elements, say): they fold in too.
	for _, c := range pending {
		c.commit()
	}
	return nil
}

// commit sends the tables' transactions as one netlink batch, which the
// kernel applies atomically: both families change together or not at all.
// After a failure the tables are no longer known to hold Weir's last
// commit, so the next sync starts from scratch. full says the transactions
// write every object (see restamp).
func (b *Backend) commit(full bool, txns ...*txn) error {
	before, gerr := b.generation()
	err := b.kernel.commit(txns)
	if err == nil {
		b.restamp(before, gerr == nil, full)
	} else {
		b.failed.refused(full, txns)
		b.gen.valid = false
		for _, tb := range b.tables {
			tb.synced = false
		}
	}
	return err
}

// Cleanup removes Weir's tables and kube-proxy's (ip and ip6 kube-proxy),
// like kube-proxy's own cleanup; it is not an error when there are none.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.kubeProxyTxns()
	for _, tb := range b.tables {
		t = append(t, dropTable(tb.layout.table))
	}
	if err := b.commit(true, t...); err != nil {
		return fmt.Errorf("remove Weir's and kube-proxy's tables: %w", err)
	}
	for _, tb := range b.tables {
		tb.state, tb.synced = newState(), false
	}
	return nil
}

// Close releases the netlink sockets.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen.valid = false
	return b.kernel.close()
}
