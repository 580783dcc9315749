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
// rules. The backend remembers what it wrote and never reads the rules back
// with iptables-save on the sync path: full syncs only look, cheaply, at
// which chains the kernel has and how many rules each holds (look.go), to
// take over the chains of kube-proxy or an earlier Weir and to find rules
// removed behind the backend's back. The jump rules from the built-in
// chains are managed with github.com/coreos/go-iptables. Every tool waits
// at most xtables.LockWait for the xtables lock.
//
// ReadBack (readback.go) reads the rules back with iptables-save for
// checking, never on the sync path.
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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/internal/sysctl"
	"github.com/weirproxy/weir/sdk/plan"
)

var (
	_ backends.Backend          = (*Backend)(nil)
	_ backends.KubeProxyRemover = (*Backend)(nil)
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
	// lookBroken is set once the look at the kernel's tables (look.go)
	// proved unreliable on this node; reconciles then check only the jump
	// rules. Atomic: the families of a full sync may run at once.
	lookBroken atomic.Bool
	// rewritten is when the last sync that rewrote every chain started.
	rewritten time.Time
	// localnet is true once route_localnet has been set.
	localnet bool
	// rewrite, when set (by tests), may change each restore text before it
	// is run.
	rewrite func(f ipFamily, text []byte) []byte
	// report holds the figures of the latest Sync (report.go).
	report backends.Report
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
	// seen is the stamp of the family's tables as Weir last knew them
	// whole, when stamped (see stamp.go).
	seen    stamp
	stamped bool
	// base is the stamp taken as the current sync began (baseOK when it
	// could be taken), checked whether this sync looked at the tables and
	// found them as written, and wrote whether it ran any command that
	// changes them: what restamp decides from.
	base            stamp
	baseOK, checked bool
	wrote           bool
	// verified is set once a look right after a rewrite saw what was
	// written (see verify).
	verified bool
	// counted are the figures of the Sync under way, owned the rule count
	// of last (report.go).
	counted figures
	owned   owned
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
// each table with one iptables-restore run. A full sync (changed nil)
// rewrites every chain once RewritePeriod has passed since the last
// rewrite; sooner it reconciles (see reconcile), which rewrites everything
// only when it finds the rules damaged. When a partial sync or a reconcile
// fails, Sync rewrites everything at once, in the same call (not after
// an xtables lock timeout, which a retry in a moment handles better); a
// failed rewrite leaves the next Sync to rewrite again. A sync that gave up
// waiting for the xtables lock fails with an *xtables.LockError.
func (b *Backend) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startReport()
	defer func() { b.finishReport(p, err == nil) }()
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	kind := "partial"
	if req.Full || !b.synced {
		kind = "rewrite"
		if b.synced && time.Since(b.rewritten) < b.opts.rewritePeriod() {
			kind = "reconcile"
		}
	}
	var st syncStats
	b.takeBases()
	switch kind {
	case "partial":
		st, err = b.partialSync(ctx, p, req.Changed)
	case "reconcile":
		st, kind, err = b.reconcile(ctx, p)
	}
	if err != nil && ctx.Err() == nil && !isLockTimeout(err) {
		b.log.Warn("An iptables restore failed; rewriting every chain now", "flavour", b.fl.name, "kind", kind, "error", err)
		kind, err = "rewrite", nil
	}
	if kind == "rewrite" && err == nil {
		var more syncStats
		more, err = b.fullSync(ctx, p)
		st = st.plus(more)
	}
	if err != nil {
		// A lock timeout wrote nothing (or only filter, which the next
		// reconcile notices): the retry need not rewrite everything.
		b.synced = b.synced && isLockTimeout(err)
		b.restamp()
		return err
	}
	if kind == "rewrite" {
		b.synced, b.rewritten = true, start
	}
	b.restamp()
	b.log.Debug("Synced iptables rules", "flavour", b.fl.name, "kind", kind, "services", len(p.Services),
		"changed", len(req.Changed), "restores", st.restores, "filterBytes", st.filter, "natBytes", st.nat,
		"duration", time.Since(start))
	return nil
}

// takeBases takes each family's stamp as a sync begins.
func (b *Backend) takeBases() {
	for _, fam := range b.fams {
		st, _, err := b.takeStamp(fam.f)
		fam.base, fam.baseOK, fam.checked, fam.wrote = st, err == nil, false, false
	}
}

// restamp decides, after a sync, whether each family's stamp still
// vouches for its tables as Weir knows them. It does only when nothing at
// all changed them during the sync (the stamp is still the one taken as it
// began: no write of Weir's, nobody else's) and they were known whole then:
// stamped with that very stamp, or looked at in this sync and found as
// written. A sync that wrote leaves the family unstamped, so the next
// reconcile looks: a stamp taken after Weir's own writes would also vouch
// for whatever someone else changed while they ran (a chain deleted during
// a partial sync stayed missing until the hourly rewrite).
func (b *Backend) restamp() {
	for _, fam := range b.fams {
		known := fam.checked || (fam.stamped && fam.base == fam.seen)
		vouch := fam.baseOK && known && !fam.wrote
		if vouch {
			now, _, err := b.takeStamp(fam.f)
			vouch = err == nil && now == fam.base
		}
		fam.seen, fam.stamped = fam.base, vouch
	}
}

// plus adds the figures of two syncs.
func (s syncStats) plus(o syncStats) syncStats {
	return syncStats{filter: s.filter + o.filter, nat: s.nat + o.nat, restores: s.restores + o.restores}
}

// isLockTimeout says whether err is, or wraps, a tool giving up waiting
// for the xtables lock.
func isLockTimeout(err error) bool {
	var l *xtables.LockError
	return errors.As(err, &l)
}

// reconcile answers a full sync requested within RewritePeriod of the
// last rewrite, like kube-proxy, which rewrites everything only hourly: it
// looks at the kernel's tables (see look.go) and, when they are as the
// backend wrote them, writes, as a partial sync of every service, only
// what differs from what it remembers writing. It returns "rewrite",
// having written nothing, when a family's rules are damaged: then
// everything must be rewritten.
func (b *Backend) reconcile(ctx context.Context, p *plan.Plan) (syncStats, string, error) {
	for _, fam := range b.fams {
		damaged, err := b.damaged(ctx, fam, p)
		if err != nil {
			return syncStats{}, "reconcile", err
		}
		if damaged {
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

// driftLimit is how many differences a log line about damaged rules
// quotes.
const driftLimit = 5

// damaged looks at the tables of one family and says whether they differ
// from what the backend wrote, logging what it found. Chains with Weir's
// names that it did not write become stray, for the next rewrite to
// delete. Without a working look it only checks the jump rules.
func (b *Backend) damaged(ctx context.Context, fam *family, p *plan.Plan) (bool, error) {
	if fam.baseOK && fam.stamped && fam.base == fam.seen {
		return false, nil // nothing changed since the last sync
	}
	if b.lookBroken.Load() {
		intact, err := ensureJumps(ctx, b.opts.NetNS, b.fl, fam.f, fam.ipt)
		if err != nil && (ctx.Err() != nil || isLockTimeout(err)) {
			return false, err
		}
		if err != nil || !intact {
			b.log.Warn("iptables jump rules were missing; rewriting every chain", "flavour", b.fl.name, "family", int(fam.f), "error", err)
			return true, nil
		}
		fam.checked = true
		return false, nil
	}
	look, err := b.lookFamily(ctx, fam.f)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		// Rewrite once, then do without the look rather than rewrite at
		// every period.
		b.distrustLook(fam, "looking failed: "+err.Error())
		return true, nil
	}
	diffs, n, unknown := drift(fam.last, newRenderer(fam.f, &b.opts, p.Node), look, driftLimit)
	fam.stray = mergeChains(fam.stray, unknown)
	if n == 0 {
		fam.checked = true
		return false, nil
	}
	args := []any{"flavour", b.fl.name, "family", int(fam.f), "differences", n, "found", strings.Join(diffs, "; ")}
	if _, who, _ := b.takeStamp(fam.f); who != "" {
		args = append(args, "lastChangedBy", string(who))
	}
	b.log.Warn("Weir's iptables rules were changed behind its back; rewriting every chain", args...)
	return true, nil
}

// fullSync rewrites every chain of both families, after looking at their
// tables and adding the missing jump rules (see prepare); after the first
// rewrite it checks that the look sees what was written (see verify). With
// iptables-nft the two families go at once: they are separate nftables
// tables, and a restart's first sync at 1k dual-stack services is that much
// sooner. iptables-legacy's tools share the xtables lock, so there they go
// one after the other, and the sync stops at a lock timeout.
func (b *Backend) fullSync(ctx context.Context, p *plan.Plan) (syncStats, error) {
	if b.opts.LocalhostNodePorts && !b.localnet {
		if err := sysctl.Set(b.opts.NetNS, "net/ipv4/conf/all/route_localnet", "1"); err != nil {
			b.log.Warn("Cannot enable route_localnet; NodePorts on 127.0.0.1 will not work", "error", err)
		}
		b.localnet = true
	}
	stats := make([]syncStats, len(b.fams))
	errs := make([]error, len(b.fams))
	if b.fl.name == flavourNFT {
		var wg sync.WaitGroup
		for i, fam := range b.fams {
			wg.Go(func() { errs[i] = b.fullSyncFamily(ctx, fam, p, &stats[i]) })
		}
		wg.Wait()
	} else {
		for i, fam := range b.fams {
			if errs[i] = b.fullSyncFamily(ctx, fam, p, &stats[i]); isLockTimeout(errs[i]) {
				break
			}
		}
	}
	var st syncStats
	for _, s := range stats {
		st = st.plus(s)
	}
	return st, errors.Join(errs...)
}

// fullSyncFamily prepares and rewrites one family's tables, then verifies
// the look; it touches no other family's state.
func (b *Backend) fullSyncFamily(ctx context.Context, fam *family, p *plan.Plan, st *syncStats) error {
	err := b.prepare(ctx, fam)
	if err == nil || !isLockTimeout(err) {
		err = errors.Join(err, b.rewriteFamily(ctx, fam, p, st))
	}
	if err == nil {
		b.verify(ctx, fam, p)
	}
	return err
}

// prepare looks at one family's tables before a rewrite, unless their
// stamp shows them as the last sync left them: the chains with Weir's
// names found there become stray, so the rewrite deletes those the plan
// does not need (kube-proxy's at takeover, leftovers of tampering), and
// the jump rules from the built-in chains are added where missing (see
// jumpRestores; the others with ensureJumps).
func (b *Backend) prepare(ctx context.Context, fam *family) error {
	if !fam.wrote && fam.baseOK && fam.stamped && fam.base == fam.seen {
		return nil // as the last sync left them: nothing stray, no jump missing
	}
	look, err := b.lookFamily(ctx, fam.f)
	if err == nil {
		found := ownedIn(look)
		if fam.last == nil && len(found) > 0 {
			b.log.Info("Taking over existing iptables chains", "family", int(fam.f), "chains", len(found[tableNAT])+len(found[tableFilter]))
		}
		fam.stray = mergeChains(fam.stray, found)
		texts, rest := jumpRestores(missingJumps(look), look)
		for _, table := range []string{tableFilter, tableNAT} {
			if texts[table] == nil {
				continue
			}
			fam.wrote = true
			if err := runRestore(ctx, b.opts.NetNS, fam.tools.restore, texts[table]); err != nil {
				return fmt.Errorf("iptables: add jump rules: %w", err)
			}
		}
		if len(rest) == 0 && !b.lookBroken.Load() {
			return nil
		}
	} else {
		b.log.Warn("Cannot look at the kernel's iptables rules before rewriting them; stale chains may stay", "family", int(fam.f), "error", err)
	}
	intact, jerr := ensureJumps(ctx, b.opts.NetNS, b.fl, fam.f, fam.ipt)
	if err == nil && jerr == nil && intact && !b.lookBroken.Load() {
		b.distrustLook(fam, "it missed jump rules that iptables -C found")
	}
	return jerr
}

// rewriteFamily writes every chain of one family, deleting the stray
// chains the plan does not need. When the kernel refuses to delete one (a
// rule of someone else's jumps to it), it writes everything again with
// the stray chains flushed but not deleted, and leaves them for the next
// rewrite.
func (b *Backend) rewriteFamily(ctx context.Context, fam *family, p *plan.Plan, st *syncStats) error {
	existing := mergeChains(fam.stray, chainsOf(fam.last))
	r, w := renderFull(fam.f, p, &b.opts, existing)
	err := b.apply(ctx, fam, r, st)
	if failedDelete(err) {
		b.log.Warn("Cannot delete stale iptables chains that another rule jumps to; emptying them instead",
			"flavour", b.fl.name, "family", int(fam.f), "error", err)
		r.Filter, r.NAT = withoutDeletes(r.Filter), withoutDeletes(r.NAT)
		if err = b.apply(ctx, fam, r, st); err == nil {
			fam.last, fam.stray = w, existing
			return nil
		}
	}
	if err != nil {
		fam.stray = mergeChains(existing, chainsOf(w))
		return err
	}
	fam.last, fam.stray = w, nil
	return nil
}

// withoutDeletes returns a restore text without its -X lines.
func withoutDeletes(text []byte) []byte {
	out := make([]byte, 0, len(text))
	for line := range bytes.Lines(text) {
		if !bytes.HasPrefix(line, []byte("-X ")) {
			out = append(out, line...)
		}
	}
	return out
}

// failedDelete says whether err is a restore that failed deleting a chain.
func failedDelete(err error) bool {
	var rf *restoreFailure
	return errors.As(err, &rf) && strings.HasPrefix(rf.line, "-X ")
}

// verify looks at one family's tables right after its first rewrite. If
// they differ from what was just written, the look cannot be trusted on
// this node (another iptables version, or another process rewriting the
// tables at the same moment): reconciles then stop relying on it, or they
// would rewrite everything every time.
func (b *Backend) verify(ctx context.Context, fam *family, p *plan.Plan) {
	if b.lookBroken.Load() || fam.verified {
		return
	}
	look, err := b.lookFamily(ctx, fam.f)
	if err != nil {
		return
	}
	if diffs, n, _ := drift(fam.last, newRenderer(fam.f, &b.opts, p.Node), look, driftLimit); n > 0 {
		b.distrustLook(fam, fmt.Sprintf("right after a rewrite it found %d differences: %s", n, strings.Join(diffs, "; ")))
		return
	}
	fam.verified = true
}

// distrustLook stops relying on the look at the kernel's tables, saying
// why.
func (b *Backend) distrustLook(fam *family, why string) {
	if !b.lookBroken.CompareAndSwap(false, true) {
		return // the other family said it already
	}
	b.log.Warn("Weir cannot check its iptables rules cheaply on this node; periodic syncs check only the jump rules, and damage inside Weir's chains waits for the hourly rewrite",
		"flavour", b.fl.name, "family", int(fam.f), "reason", why)
}

// partialSync writes the changed services of both families. It stops at
// an xtables lock timeout.
func (b *Backend) partialSync(ctx context.Context, p *plan.Plan, changed []plan.Key) (syncStats, error) {
	var st syncStats
	var errs []error
	for _, fam := range b.fams {
		r, w := renderPartial(fam.f, p, changed, fam.last, &b.opts)
		if err := b.apply(ctx, fam, r, &st); err != nil {
			fam.stray = mergeChains(fam.stray, chainsOf(w))
			errs = append(errs, err)
			if isLockTimeout(err) {
				break
			}
			continue
		}
		fam.followPartial(w, changed, r.Full)
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
		table string
		text  []byte
		size  *int
	}{{tableFilter, r.Filter, &st.filter}, {tableNAT, r.NAT, &st.nat}} {
		text := t.text
		if b.rewrite != nil {
			text = b.rewrite(fam.f, text)
		}
		*t.size += len(text)
		if !hasRules(text) {
			continue
		}
		st.restores++
		fam.wrote = true
		err := runRestore(ctx, b.opts.NetNS, fam.tools.restore, text)
		if bare, ok := withoutList(text); ok && killed(err) && ctx.Err() == nil {
			b.log.Warn("iptables-restore died listing the table first; retrying without", "error", err)
			err = runRestore(ctx, b.opts.NetNS, fam.tools.restore, bare)
		}
		if err != nil {
			fam.counted.refused(r.Full)
			return err
		}
		fam.counted.accepted(t.table, text)
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

// Cleanup removes everything Weir, or kube-proxy in iptables or IPVS mode,
// put in the nat and filter tables of both families, and kube-proxy's
// canary chains in mangle, nat and filter: the jump rules into those
// chains, then the chains. Other rules and chains stay. It is not an
// error when there is nothing to remove.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, err := b.removeChains(ctx, func(table, c string) bool {
		return (table != tableMangle && ownedChain(c)) || kubeProxyLeftover(table, c)
	})
	for _, fam := range b.fams {
		fam.last, fam.stray, fam.stamped = nil, nil, false
	}
	b.synced = false
	return err
}

// Close releases the backend's resources; it holds none between calls.
func (b *Backend) Close() error { return nil }
