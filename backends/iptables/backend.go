// Package iptables programs Weir's plan into the kernel with iptables, in
// kube-proxy's chain layout (KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-* and the
// rest), so kube-proxy's runbooks apply and a node can switch between
// kube-proxy and Weir, either way, without a reboot.
//
// Both flavours work: iptables-nft and iptables-legacy, detected like
// kube-proxy's iptables-wrapper (the flavour already holding rules wins,
// nft by default) or chosen in Options.Flavour. IPv4 goes through iptables,
// IPv6 through ip6tables, each with tables nat and filter.
//
// A sync writes each table with one iptables-restore --noflush run (filter
// first, then nat). A full sync rewrites every chain; a partial sync writes
// only the changed services' chains and adds or deletes single dispatch
// rules. The backend remembers what it wrote and never reads the tables back
// on the sync path, except once, on the first full sync, to list the
// KUBE-* chains left by kube-proxy or an earlier Weir so that orphans are
// deleted. The jump rules from the built-in chains are managed with
// github.com/coreos/go-iptables.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/internal/sysctl"
	"github.com/weirproxy/weir/sdk/plan"
)

// Backend is the iptables backend. It is safe for one caller at a time.
type Backend struct {
	mu   sync.Mutex
	opts Options
	log  *slog.Logger
	fl   *flavour
	fams []*family // IPv4, then IPv6
	// synced is true after a full sync that succeeded in every table, until
	// a sync fails: partial syncs need it.
	synced bool
	// listed is true once the first full sync has listed the kernel's
	// KUBE-* chains for takeover.
	listed bool
	// rewritten is when the last sync that rewrote every chain started.
	rewritten time.Time
	// localnet is true once route_localnet has been set.
	localnet bool
	// rewrite, when set (by tests), may change each restore text before it
	// is run.
	rewrite func(f ipFamily, text []byte) []byte
}

// family is the backend's state for one IP family.
type family struct {
	f     ipFamily
	tools tools
	ipt   *goipt.IPTables
	// last is what the last successful restores wrote; nil before the
	// first full sync.
	last *written
	// stray lists, per table, chains that may be in the kernel without last
	// knowing them: found at takeover, or written by a restore of a sync
	// that then failed. The next full sync deletes those it does not need.
	stray map[string][]string
}

// New returns a backend that programs the network namespace in opts with
// the iptables flavour opts asks for (detected when "auto" or empty).
func New(opts Options) (*Backend, error) {
	log := opts.Logger()
	opts.Log = log
	fl, err := chooseFlavour(context.Background(), opts.NetNS, opts.Flavour)
	if err != nil {
		return nil, err
	}
	opts.Flavour = fl.name // the renderer orders chains for it
	b := &Backend{opts: opts, log: log, fl: fl}
	for _, f := range []ipFamily{ipv4, ipv6} {
		ipt, err := newIPTables(fl, f)
		if err != nil {
			return nil, err
		}
		b.fams = append(b.fams, &family{f: f, tools: fl.tools(f), ipt: ipt})
	}
	log.Debug("Using iptables", "flavour", fl.name, "requested", opts.Flavour)
	return b, nil
}

// Flavour returns the flavour in use, "nft" or "legacy".
func (b *Backend) Flavour() string { return b.fl.name }

// syncStats describes one sync for the log.
type syncStats struct {
	filter, nat int // bytes of restore text
	restores    int // iptables-restore runs
}

// Sync makes the kernel match p; see backends.Backend. Changes go into
// each table with one iptables-restore run; a sync after a failed one
// rewrites everything. So does a full sync (changed nil) once
// RewritePeriod has passed since the last rewrite, or when a jump rule is
// missing; a full sync sooner reconciles: see reconcile.
func (b *Backend) Sync(ctx context.Context, p *plan.Plan, changed []plan.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	kind := "partial"
	if changed == nil || !b.synced {
		kind = "rewrite"
		if b.synced && time.Since(b.rewritten) < b.opts.rewritePeriod() {
			kind = "reconcile"
		}
	}
	var st syncStats
	var err error
	switch kind {
	case "partial":
		st, err = b.partialSync(ctx, p, changed)
	case "reconcile":
		st, kind, err = b.reconcile(ctx, p)
	}
	if kind == "rewrite" {
		st, err = b.fullSync(ctx, p)
	}
	if err != nil {
		b.synced = false
		return err
	}
	if kind == "rewrite" {
		b.synced, b.rewritten = true, start
	}
	b.log.Debug("Synced iptables rules", "flavour", b.fl.name, "kind", kind, "services", len(p.Services),
		"changed", len(changed), "restores", st.restores, "filterBytes", st.filter, "natBytes", st.nat,
		"duration", time.Since(start))
	return nil
}

// reconcile answers a full sync requested within RewritePeriod of the
// last rewrite, like kube-proxy, which rewrites everything only hourly: it
// checks that every jump rule is in place (flushing the built-in chains
// removes them; kube-proxy watches a canary chain for that) and writes,
// as a partial sync of every service, only what differs from what the
// backend remembers writing. It returns "rewrite", having done nothing,
// when a jump rule was missing: then everything must be rewritten.
func (b *Backend) reconcile(ctx context.Context, p *plan.Plan) (syncStats, string, error) {
	for _, fam := range b.fams {
		intact, err := ensureJumps(ctx, b.opts.NetNS, b.fl, fam.f, fam.ipt)
		if err != nil || !intact {
			b.log.Info("iptables jump rules were missing; rewriting every chain", "family", fam.f, "error", err)
			return syncStats{}, "rewrite", nil
		}
	}
	keys := p.Keys()
	for _, fam := range b.fams {
		fam.last.each(func(k plan.Key, _ *svcWritten) {
			if p.Services[k] == nil {
				keys = append(keys, k)
			}
		})
	}
	st, err := b.partialSync(ctx, p, keys)
	return st, "reconcile", err
}

// fullSync checks the jump rules and rewrites every chain of both
// families.
func (b *Backend) fullSync(ctx context.Context, p *plan.Plan) (syncStats, error) {
	var st syncStats
	if b.opts.LocalhostNodePorts && !b.localnet {
		if err := sysctl.Set(b.opts.NetNS, "net/ipv4/conf/all/route_localnet", "1"); err != nil {
			b.log.Warn("Cannot enable route_localnet; NodePorts on 127.0.0.1 will not work", "error", err)
		}
		b.localnet = true
	}
	if !b.listed {
		if err := b.listExisting(ctx); err != nil {
			return st, err
		}
		b.listed = true
	}
	var errs []error
	for _, fam := range b.fams {
		if _, err := ensureJumps(ctx, b.opts.NetNS, b.fl, fam.f, fam.ipt); err != nil {
			errs = append(errs, err)
		}
		existing := mergeChains(fam.stray, chainsOf(fam.last))
		r, w := renderFull(fam.f, p, &b.opts, existing)
		if err := b.apply(ctx, fam, r, &st); err != nil {
			fam.stray = mergeChains(fam.stray, chainsOf(w))
			errs = append(errs, err)
			continue
		}
		fam.last, fam.stray = w, nil
	}
	return st, errors.Join(errs...)
}

// partialSync writes the changed services of both families.
func (b *Backend) partialSync(ctx context.Context, p *plan.Plan, changed []plan.Key) (syncStats, error) {
	var st syncStats
	var errs []error
	for _, fam := range b.fams {
		r, w := renderPartial(fam.f, p, changed, fam.last, &b.opts)
		if err := b.apply(ctx, fam, r, &st); err != nil {
			fam.stray = mergeChains(fam.stray, chainsOf(w))
			errs = append(errs, err)
			continue
		}
		fam.last = w
	}
	return st, errors.Join(errs...)
}

// listFirst puts -S (list the table) first in a restore text, for
// iptables-nft renders of everything (full syncs, and partial syncs that a
// node change turns into one). iptables-nft 1.8 keeps every chain a restore
// names in a sorted linked list and fetches them one by one: quadratic in
// the text's size (a nat text of 10k services took 224 s into an empty
// table, longer over a full one). A command naming no chain makes it fetch
// every chain in one dump instead: 16 s, 19 s over a full table. The
// listing, discarded, costs little. It sorts the chains with a recursive
// quicksort that overflows the stack when the kernel holds 100k chains in
// name order, so renderFull declares them in name order only for legacy,
// and apply retries without it if iptables-nft dies of a signal.
func listFirst(text []byte) []byte {
	i := bytes.IndexByte(text, '\n') + 1
	return slices.Concat(text[:i], []byte(listLine), text[i:])
}

// listLine is the line listFirst adds.
const listLine = "-S\n"

// apply runs the restores of one family: filter first, then nat. Filter
// rules (rejects for services without endpoints, firewall drops) only see
// packets that nat did not translate, so writing them first never lets
// through, even for a moment, traffic the new rules forbid; and a failed
// nat restore leaves the old translations serving. Each restore is atomic
// per table; a text without rules is not run.
func (b *Backend) apply(ctx context.Context, fam *family, r restore, st *syncStats) error {
	if r.Full && b.fl.name == flavourNFT {
		r.NAT = listFirst(r.NAT)
	}
	for _, t := range []struct {
		text []byte
		size *int
	}{{r.Filter, &st.filter}, {r.NAT, &st.nat}} {
		text := t.text
		if b.rewrite != nil {
			text = b.rewrite(fam.f, text)
		}
		*t.size += len(text)
		if !hasRules(text) {
			continue
		}
		st.restores++
		err := runRestore(ctx, b.opts.NetNS, fam.tools.restore, text)
		if bare, ok := withoutList(text); ok && killed(err) && ctx.Err() == nil {
			b.log.Warn("iptables-restore died listing the table first; retrying without", "error", err)
			err = runRestore(ctx, b.opts.NetNS, fam.tools.restore, bare)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// withoutList undoes listFirst: the text without its listing line, and
// whether it had one.
func withoutList(text []byte) ([]byte, bool) {
	i := bytes.IndexByte(text, '\n') + 1
	if !bytes.HasPrefix(text[i:], []byte(listLine)) {
		return text, false
	}
	return slices.Concat(text[:i], text[i+len(listLine):]), true
}

// killed says whether err is that of a process a signal ended.
func killed(err error) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// listExisting lists, once per process, Weir's chains already in the
// kernel (kube-proxy's or an earlier Weir's) so the first full sync can
// take them over and delete the orphans.
func (b *Backend) listExisting(ctx context.Context) error {
	for _, fam := range b.fams {
		found := map[string][]string{}
		for _, table := range []string{tableFilter, tableNAT} {
			chains, _, err := ownedChains(ctx, b.opts.NetNS, fam.tools.save, table)
			if err != nil {
				return fmt.Errorf("iptables: list existing chains for takeover: %w", err)
			}
			if len(chains) > 0 {
				found[table] = chains
			}
		}
		fam.stray = mergeChains(fam.stray, found)
		if n := len(found[tableFilter]) + len(found[tableNAT]); n > 0 {
			b.log.Info("Taking over existing iptables chains", "family", int(fam.f), "chains", n)
		}
	}
	return nil
}

// mergeChains returns the union of per-table chain lists, sorted.
func mergeChains(lists ...map[string][]string) map[string][]string {
	sets := map[string]map[string]bool{}
	for _, l := range lists {
		for table, chains := range l {
			if sets[table] == nil {
				sets[table] = map[string]bool{}
			}
			for _, c := range chains {
				sets[table][c] = true
			}
		}
	}
	out := make(map[string][]string, len(sets))
	for table, set := range sets {
		out[table] = slices.Sorted(maps.Keys(set))
	}
	return out
}

// Cleanup removes everything Weir (or kube-proxy in iptables mode) put in
// the nat and filter tables of both families: the jump rules into its
// chains, then the chains. Other rules and chains stay. It is not an error
// when there is nothing to remove.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, fam := range b.fams {
		for _, table := range []string{tableFilter, tableNAT} {
			if err := cleanupTable(ctx, b.opts.NetNS, fam.ipt, fam.tools, table); err != nil {
				errs = append(errs, err)
			}
		}
		fam.last, fam.stray = nil, nil
	}
	b.synced, b.listed = false, false
	return errors.Join(errs...)
}

// Close releases the backend's resources; it holds none between calls.
func (b *Backend) Close() error { return nil }
