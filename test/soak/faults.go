package soak

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/test/programt"
)

// windows records when faults were in effect, so that probe failures and
// lost connections during them are told apart from the rest.
type windows struct {
	mu   sync.Mutex
	list []window
}

type window struct {
	name       string
	start, end time.Time // end is zero while open
}

// open starts a window named name and returns its index.
func (w *windows) open(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, window{name: name, start: time.Now()})
	return len(w.list) - 1
}

// add records a window that has already ended.
func (w *windows) add(name string, start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, window{name: name, start: start, end: end})
}

func (w *windows) close(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list[i].end = time.Now()
}

// openDuring returns the name of a window that overlaps [from, to], or "".
func (w *windows) openDuring(from, to time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.list) - 1; i >= 0; i-- {
		win := w.list[i]
		if !win.start.After(to) && (win.end.IsZero() || !win.end.Before(from)) {
			return win.name
		}
	}
	return ""
}

// injected is what a fault did.
type injected struct {
	// at is the reference for the time to converge: when the fault ended
	// (a restart, a release) or was done (a deletion).
	at time.Time
	// restart says at is a new weir process's start.
	restart bool
	note    string
	// undo, when set, ends the fault at the start of the next round and
	// returns when it did; the convergence after it is measured too.
	undo func(ctx context.Context) (time.Time, string, error)
	// limit extends the wait for convergence.
	limit time.Duration
}

// fault is one kind of fault the soak injects.
type fault struct {
	name    string
	applies func(s *run) bool
	inject  func(ctx context.Context, s *run) (injected, error)
}

func always(*run) bool { return true }

func withPlugins(s *run) bool { return !s.cfg.NoPlugins }

func kubernetesSource(s *run) bool { return s.cfg.Source == "kubernetes" }

func filesSource(s *run) bool { return s.cfg.Source == "files" }

func nftablesMode(s *run) bool { return s.cfg.backendMode() == "nftables" }

func iptablesMode(s *run) bool { return s.cfg.backendMode() == "iptables" }

// usesIPTables: mode iptables, and mode ipvs for its masquerade rules.
func usesIPTables(s *run) bool { return iptablesMode(s) || ipvsMode(s) }

// legacyFlavour: only iptables-legacy takes the xtables lock.
func legacyFlavour(s *run) bool { return usesIPTables(s) && s.flavour() == "legacy" }

var faults = []fault{
	{"none", always, func(context.Context, *run) (injected, error) { return injected{at: time.Now()}, nil }},
	{"SIGKILL during a full sync", always, killDuringFullSync},
	{"SIGTERM and restart", always, termAndRestart},
	{"kube-apiserver restart", kubernetesSource, restartAPIServer},
	{"source folder removed", filesSource, removeFolder},
	{"nft flush ruleset", always, nftCommand("flush ruleset")},
	{"nftables table deleted", nftablesMode, deleteTable},
	{"nftables map or chain deleted", nftablesMode, deleteMapOrChain},
	{"iptables chain deleted", usesIPTables, deleteIPTablesChain},
	{"IPVS virtual servers flushed", ipvsMode, flushIPVS},
	{"IPVS virtual server deleted", ipvsMode, deleteVirtualServer},
	{"IPVS interface deleted", ipvsMode, deleteIPVSInterface},
	{"IPVS ipset flushed", ipvsMode, flushIPVSSet},
	{"xtables lock held", legacyFlavour, holdXtablesLock},
	{"conflicting objects", always, createConflict},
	{"plugin replaced: open, traps", withPlugins, replacePlugin("victim-open-trap")},
	{"plugin replaced: open, loops", withPlugins, replacePlugin("victim-open-loop")},
	{"plugin replaced: closed, traps", withPlugins, replacePlugin("victim-closed-trap")},
	{"plugin replaced: closed, loops", withPlugins, replacePlugin("victim-closed-loop")},
}

// restartWeir starts a new weir process after the previous one exited.
func (s *run) restartWeir() (injected, error) {
	p, err := s.d.start()
	if err != nil {
		return injected{}, err
	}
	return injected{at: p.started, restart: true}, nil
}

// killDuringFullSync waits for weir to log the start of a full sync, sends
// SIGKILL at once and starts weir again.
func killDuringFullSync(ctx context.Context, s *run) (injected, error) {
	p := s.d.current()
	select {
	case <-p.fullSync: // a stale signal
	default:
	}
	waited := "at the start of a full sync"
	select {
	case <-p.fullSync:
	case <-time.After(3 * s.cfg.SyncPeriod):
		waited = "without seeing a full sync start within three sync periods"
	case <-ctx.Done():
		return injected{}, ctx.Err()
	}
	s.d.kill()
	mid := midSync(p.logPath)
	if mid {
		s.rep.killsMidSync++
	}
	in, err := s.restartWeir()
	in.note = fmt.Sprintf("killed %s (in the middle of it: %v)", waited, mid)
	return in, err
}

// midSync reports whether the log ends inside a sync: a "Syncing rules"
// line with no line after it saying how it ended.
func midSync(logPath string) bool {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return false
	}
	text := string(b)
	i := strings.LastIndex(text, `msg="Syncing rules"`)
	return i >= 0 && !strings.Contains(text[i:], `msg="Synced rules"`) && !strings.Contains(text[i:], "Failed to execute sync")
}

// termAndRestart stops weir with SIGTERM, as a rolling update does, and
// starts it again.
func termAndRestart(ctx context.Context, s *run) (injected, error) {
	took, clean := s.d.term(30 * time.Second)
	s.rep.stops = append(s.rep.stops, took)
	if !clean {
		s.rep.stopsKilled++
	}
	in, err := s.restartWeir()
	in.note = fmt.Sprintf("stopped in %v (by itself: %v)", took.Round(time.Millisecond), clean)
	return in, err
}

func restartAPIServer(ctx context.Context, s *run) (injected, error) {
	begin := time.Now()
	if err := programt.Catch(func() { s.c.cp.RestartAPIServer(s.t) }); err != nil {
		return injected{}, err
	}
	return injected{at: time.Now(), note: fmt.Sprintf("down and back in %v", time.Since(begin).Round(time.Millisecond))}, nil
}

// nftCommand runs one nft command in the node, as an operator would.
func nftCommand(cmd string) func(context.Context, *run) (injected, error) {
	return func(ctx context.Context, s *run) (injected, error) {
		if err := s.nodeCommand(ctx, "nft", strings.Fields(cmd)...); err != nil {
			return injected{}, err
		}
		return injected{at: time.Now(), note: "nft " + cmd}, nil
	}
}

// nodeCommand runs a command in the node namespace.
func (s *run) nodeCommand(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := s.c.topo.Node.Command(ctx, name, args...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func deleteTable(ctx context.Context, s *run) (injected, error) {
	family := []string{"ip", "ip6"}[s.faultRNG.IntN(2)]
	return nftCommand("delete table "+family+" weir")(ctx, s)
}

// deleteMapOrChain deletes one of Weir's maps or chains, or, when the
// kernel refuses because rules still refer to it, flushes it.
func deleteMapOrChain(ctx context.Context, s *run) (injected, error) {
	family := []string{"ip", "ip6"}[s.faultRNG.IntN(2)]
	objs, err := nftObjects(s.c.topo.Node, family)
	if err != nil {
		return injected{}, err
	}
	if len(objs) == 0 {
		return injected{}, errors.New("no map or chain in table " + family + " weir")
	}
	o := objs[s.faultRNG.IntN(len(objs))]
	del := fmt.Sprintf("delete %s %s weir %s", o.kind, family, o.name)
	if err := s.nodeCommand(ctx, "nft", strings.Fields(del)...); err == nil {
		return injected{at: time.Now(), note: "nft " + del}, nil
	}
	flush := fmt.Sprintf("flush %s %s weir %s", o.kind, family, o.name)
	if err := s.nodeCommand(ctx, "nft", strings.Fields(flush)...); err != nil {
		return injected{}, err
	}
	return injected{at: time.Now(), note: "nft " + flush + " (the kernel refused to delete it: still referenced)"}, nil
}

// deleteIPTablesChain removes one of Weir's service chains from the nat
// table with every rule that jumps to it, in one iptables-restore. Weir
// may rewrite the chains between the save and the restore; then the
// restore fails and the soak tries again.
func deleteIPTablesChain(ctx context.Context, s *run) (injected, error) {
	var err error
	for range 5 {
		var in injected
		if in, err = deleteChainOnce(ctx, s); err == nil {
			return in, nil
		}
	}
	return injected{}, err
}

func deleteChainOnce(ctx context.Context, s *run) (injected, error) {
	fl := s.flavour()
	save, err := s.nodeOutput(ctx, "iptables-"+fl+"-save", "-t", "nat")
	if err != nil {
		return injected{}, err
	}
	chains, rules := parseSave(save)
	var victims []string
	prefixes := []string{"KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-"}
	if ipvsMode(s) {
		prefixes = []string{"WEIR-IPVS-"}
	}
	for _, c := range chains {
		if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(c, p) }) {
			victims = append(victims, c)
		}
	}
	if len(victims) == 0 {
		return injected{}, fmt.Errorf("no chain named %s* in the nat table", strings.Join(prefixes, "*, "))
	}
	victim := victims[s.faultRNG.IntN(len(victims))]
	var script strings.Builder
	script.WriteString("*nat\n")
	refs := 0
	for _, r := range rules {
		if strings.HasSuffix(r, " -j "+victim) || strings.Contains(r, " -j "+victim+" ") {
			script.WriteString("-D" + strings.TrimPrefix(r, "-A") + "\n")
			refs++
		}
	}
	fmt.Fprintf(&script, "-F %s\n-X %s\nCOMMIT\n", victim, victim)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := s.c.topo.Node.Command(ctx, "iptables-"+fl+"-restore", "--noflush")
	cmd.Env = s.env
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return injected{}, fmt.Errorf("iptables-%s-restore: %w: %s", fl, err, out)
	}
	return injected{at: time.Now(), note: fmt.Sprintf("deleted chain %s and the %d rules jumping to it", victim, refs)}, nil
}

// parseSave lists the chains and the rules of one table of iptables-save.
func parseSave(save string) (chains, rules []string) {
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				chains = append(chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			rules = append(rules, line)
		}
	}
	return chains, rules
}

func (s *run) nodeOutput(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := s.c.topo.Node.Command(ctx, name, args...)
	cmd.Env = s.env
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// holdXtablesLock takes the xtables lock that Weir's iptables-legacy runs
// use (a private file: XTABLES_LOCKFILE) for the configured hold, as a
// stuck tool on the node would, while the churn goes on.
func holdXtablesLock(ctx context.Context, s *run) (injected, error) {
	f, err := os.OpenFile(s.lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return injected{}, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return injected{}, err
	}
	begin := time.Now()
	s.churnFor(ctx, s.cfg.LockHold)
	// Closing the file releases the lock too, should the unlock fail.
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
	return injected{at: time.Now(), note: fmt.Sprintf("held for %v while the churn went on",
		time.Since(begin).Round(time.Millisecond))}, nil
}

// removeFolder moves the files source's folder away for a few seconds,
// as a botched deployment of the manifests would, and back: the rules must
// keep serving meanwhile and the changes made before apply once it is back.
func removeFolder(ctx context.Context, s *run) (injected, error) {
	dir := s.files.dir
	if err := os.Rename(dir, dir+".away"); err != nil {
		return injected{}, err
	}
	unhealthy := false
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) && pause(ctx, 250*time.Millisecond) {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		code, err := s.d.healthz(hctx)
		cancel()
		unhealthy = unhealthy || (err == nil && code != http.StatusOK)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		return injected{}, err
	}
	return injected{at: time.Now(), note: fmt.Sprintf("away for 5 s; /healthz reported it: %v", unhealthy)}, nil
}

// createConflict creates a service that claims a destination of an older
// one, both with endpoints: the older must keep it, and everything else
// must keep syncing. The API server refuses two services with one node
// port or one cluster IP; it allows an external IP that is another's
// cluster IP, or another's external or load-balancer IP. A folder of
// manifests can hold all of them.
func createConflict(ctx context.Context, s *run) (injected, error) {
	ch := s.churn
	var older []*service
	for _, o := range ch.svcs {
		if !o.conflict && time.Since(o.created()) > 3*time.Second && len(o.clusterIPs()) > 0 {
			older = append(older, o)
		}
	}
	if len(older) == 0 {
		return injected{at: time.Now(), note: "no service old enough to conflict with"}, nil
	}
	a := older[ch.rng.IntN(len(older))]
	b := ch.newService()
	b.conflict, b.victim = true, ""
	delete(b.annotations, hostileAnnotation)
	for _, v := range victimSlots {
		delete(b.annotations, victimAnnotation(v.name))
	}
	b.kind, b.lbIP, b.etpLocal = corev1.ServiceTypeClusterIP, netip.Addr{}, false
	b.ports = []svcPort{{name: "http", proto: corev1.ProtocolTCP, port: a.ports[0].port}}
	claim := a.clusterIPs()[0]
	what := "cluster IP"
	files := s.cfg.Source == "files"
	switch {
	case files && a.nodePort(a.ports[0].name) != 0 && ch.rng.IntN(2) == 0:
		b.kind, b.forceNodePort, what = corev1.ServiceTypeNodePort, int32(a.nodePort(a.ports[0].name)), "node port"
	case files && ch.rng.IntN(2) == 0:
		b.forceClusterIP, b.dual, what = claim, false, "cluster IP (as its own)"
		b.slices = slices.DeleteFunc(b.slices, func(sl *slice) bool { return sl.family != 4 })
	case a.lbIP.IsValid() && ch.rng.IntN(2) == 0:
		b.kind, b.lbIP, claim, what = corev1.ServiceTypeLoadBalancer, a.lbIP, a.lbIP, "load-balancer IP"
	case len(a.externalIPs) > 0 && ch.rng.IntN(2) == 0:
		claim, what = a.externalIPs[0], "external IP"
		b.externalIPs = []netip.Addr{claim}
	default:
		b.externalIPs = []netip.Addr{claim}
	}
	for _, sl := range b.slices {
		for i := range sl.eps {
			sl.eps[i].state = epReady
		}
	}
	ch.svcs = append(ch.svcs, b)
	if err := ch.w.createService(ctx, b); err != nil {
		ch.remove(b)
		ch.purge = append(ch.purge, b)
		return injected{}, err
	}
	s.lastWrite = time.Now()
	undo := func(ctx context.Context) (time.Time, string, error) {
		ch.remove(b)
		err := ch.w.deleteService(ctx, b)
		if err != nil {
			ch.purge = append(ch.purge, b)
		}
		s.lastWrite = time.Now()
		return time.Now(), "deleted " + b.key(), err
	}
	note := fmt.Sprintf("%s (newer) claims %s's %s %s port %d", b.key(), a.key(), what, claim, a.ports[0].port)
	if b.forceNodePort != 0 {
		note = fmt.Sprintf("%s (newer) claims %s's node port %d", b.key(), a.key(), b.forceNodePort)
	}
	return injected{at: time.Now(), note: note, undo: undo}, nil
}

// replacePlugin replaces a victim slot's guest with the hostile one until
// the next round, while the churn goes on.
func replacePlugin(slot string) func(context.Context, *run) (injected, error) {
	return func(ctx context.Context, s *run) (injected, error) {
		before := s.pluginFailures(ctx)
		if err := installGuest(s.pluginDir, slot, s.guests.hostile); err != nil {
			return injected{}, err
		}
		victims := 0
		for _, o := range s.churn.svcs {
			if o.victim == slot {
				victims++
			}
		}
		undo := func(ctx context.Context) (time.Time, string, error) {
			failed := s.pluginFailures(ctx) - before
			err := installGuest(s.pluginDir, slot, s.guests.benign)
			note := fmt.Sprintf("the benign guest is back in %s, after %.0f failed calls of the hostile one", slot, failed)
			if failed == 0 {
				note += " (no batch reached it: the fault had no effect)"
			}
			return time.Now(), note, err
		}
		i := slices.IndexFunc(victimSlots, func(v victimSlot) bool { return v.name == slot })
		note := fmt.Sprintf("%s (failurePolicy %s, mode %s) now hostile for its %d services",
			slot, victimSlots[i].policy, victimSlots[i].mode, victims)
		return injected{at: time.Now(), note: note, undo: undo}, nil
	}
}

// pluginFailures is weir_plugin_failures_total of the running weir, or 0.
func (s *run) pluginFailures(ctx context.Context) float64 {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	m, err := s.d.scrape(ctx)
	if err != nil {
		return 0
	}
	return m[mPluginFailure]
}
