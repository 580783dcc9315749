// Package files is the source that reads ordinary Kubernetes manifests
// (Services, EndpointSlices and Nodes) from a directory and watches it, so
// Weir can run with no cluster at all. It keeps, and delivers, the records
// of the objects (source.Compactor), not the objects themselves.
//
// Every *.yaml, *.yml and *.json file below the directory counts, following
// symbolic links and skipping hidden names, which fits a ConfigMap volume's
// ..data layout. YAML files may hold several documents, and a document may be
// a List. When two files define the same object, the lexically last path
// wins. A document that cannot be parsed is logged and skipped; it never
// deletes what its file defined before. An object over 1.5 MiB is skipped
// the same way before it is decoded, and a file over 32 MiB is not read at
// all (its last good objects stay). A symbolic link that loops is skipped
// with one warning.
//
// Changes are seen through inotify watches on the directory and every
// directory below it. A file being written is read once its writer closes
// it (or leaves it unchanged for five seconds), so a slow rewrite in place
// never delivers half a file. A link to a file outside those directories is
// read, but edits to its target go unnoticed until the link itself changes
// or a ConfigMap-style ..data swap triggers a full rescan.
//
// The directory itself is checked every second: if it goes away, its
// objects stay delivered, nothing is deleted, and a handler that is a
// source.Reporter hears that the source is down; once it is back and has
// been quiet for a second, it is read again, the differences delivered,
// and the source is up. If source.path is a symbolic link re-pointed to
// another folder, that folder is read.
package files

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/weirproxy/weir/core/source"
)

const (
	// debounce is how long the directory must stay quiet before a reload.
	debounce = 10 * time.Millisecond
	// maxDelay bounds how long a stream of events can postpone a reload.
	maxDelay = time.Second
	// writeQuiet is how long a file that was written to and not closed
	// must stay unchanged before it is read anyway, for a writer that
	// keeps it open.
	writeQuiet = 5 * time.Second
	// rootPoll is how often the source checks that source.path is still
	// there and still leads to the same folder.
	rootPoll = time.Second
	// returnQuiet is how long a folder that came back must stay quiet
	// before it is read, so that one still being filled is read whole;
	// returnDelay bounds the wait.
	returnQuiet = time.Second
	returnDelay = 10 * time.Second
)

// tuning holds the source's delays; tests shorten some.
type tuning struct {
	writeQuiet, rootPoll, returnQuiet, returnDelay time.Duration
}

// Source reads Kubernetes manifests from a directory and delivers their changes.
type Source struct {
	dir  string
	log  *slog.Logger
	tune tuning
}

var _ source.Source = (*Source)(nil)

// New returns a source that reads Kubernetes manifests from dir.
func New(dir string, log *slog.Logger) *Source {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{dir: filepath.Clean(dir), log: log,
		tune: tuning{writeQuiet: writeQuiet, rootPoll: rootPoll, returnQuiet: returnQuiet, returnDelay: returnDelay}}
}

// Run loads every manifest, delivers the records to h (Nodes, then Services,
// then EndpointSlices; objects made from them when h is not a
// source.RecordHandler) and calls h.OnSynced; it then delivers each change to
// the directory until ctx is done, when it returns nil. It fails if the
// directory is missing at start. A directory removed later is waited for,
// its objects kept, and reported to h if h is a source.Reporter. All calls
// to h come from the goroutine that called Run.
func (s *Source) Run(ctx context.Context, h source.Handler) error {
	if err := checkDir(s.dir); err != nil {
		return err
	}
	w, err := newWatcher()
	if err != nil {
		return fmt.Errorf("files source: watching source.path %q: %w", s.dir, err)
	}
	defer w.close()
	r := newRun(s, w, h)
	defer r.timer.Stop()
	if err := r.rescan(); err != nil {
		return err
	}
	changes := r.st.diff()
	deliver(r.h, changes)
	r.logLoaded(changes)
	r.h.OnSynced()
	return r.loop(ctx)
}

// checkDir returns an error naming source.path unless dir is a directory.
func checkDir(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("files source: source.path %q: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("files source: source.path %q: not a directory", dir)
	}
	return nil
}

// run is the state of one call to Run.
type run struct {
	log      *slog.Logger
	h        source.RecordHandler
	reporter source.Reporter // h, if it is one
	tune     tuning
	tree     *tree
	st       *state
	pending  map[string]bool      // paths with events since the last reload
	writing  map[string]time.Time // files written to and not closed yet, with the last write
	full     bool                 // rescan everything at the next reload
	first    time.Time            // when the oldest pending event arrived
	due      time.Time            // when the pending events are reloaded
	timer    *time.Timer          // fires at the next due time or write timeout
	real     string               // the folder source.path led to at the last scan
	down     error                // why source.path cannot be read, while it cannot
	back     bool                 // source.path came back and is waited on to settle
}

// newRun returns a run with a stopped timer.
func newRun(s *Source, w *watcher, h source.Handler) *run {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	r := &run{
		log:     s.log,
		h:       source.Records(h),
		tune:    s.tune,
		tree:    &tree{root: s.dir, log: s.log, watcher: w, dirs: map[string]bool{}, warned: map[string]bool{}},
		st:      newState(s.log),
		pending: map[string]bool{},
		writing: map[string]time.Time{},
		timer:   timer,
	}
	r.reporter, _ = h.(source.Reporter)
	return r
}

// loop handles file events, the reload timer and the check of source.path
// until ctx is done.
func (r *run) loop(ctx context.Context) error {
	w := r.tree.watcher
	poll := time.NewTicker(r.tune.rootPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.events:
			if !ok {
				return errors.New("files source: file watcher closed")
			}
			r.note(ev)
		case err, ok := <-w.errors:
			if !ok {
				return errors.New("files source: file watcher closed")
			}
			r.log.Warn("File watch error; rescanning manifests", "path", r.tree.root, "error", err)
			r.full = true
			r.schedule()
		case <-poll.C:
			r.checkRoot()
		case <-r.timer.C:
			r.fire()
		}
	}
}

// note records one file event. A file being written is not read until its
// writer closes it (or leaves it unchanged for writeQuiet), so a slow
// write never delivers half a file.
func (r *run) note(ev fsEvent) {
	name := filepath.Clean(ev.name)
	base := filepath.Base(name)
	switch {
	case name == r.tree.root:
		if !ev.has(opRemove | opRename) {
			return
		}
		r.full = true
	case isAtomicWriterName(base):
		r.full = true // a ConfigMap volume swapped its ..data link
	case isHidden(base):
		return // editor swap files and the like
	case ev.has(opWrite|opCloseWrite) && !isManifest(base):
		return
	case ev.has(opCloseWrite):
		delete(r.writing, name)
		r.pending[name] = true
	case ev.has(opWrite):
		r.writing[name] = time.Now()
		r.arm()
		return
	default:
		if ev.has(opRemove | opRename) {
			delete(r.writing, name)
		}
		r.pending[name] = true
	}
	r.schedule()
}

// schedule sets the reload of the pending events quiet after now, but no
// later than the cap after the oldest of them: debounce and maxDelay, or
// returnQuiet and returnDelay for a folder that came back.
func (r *run) schedule() {
	quiet, limit := debounce, maxDelay
	if r.back {
		quiet, limit = r.tune.returnQuiet, r.tune.returnDelay
	}
	now := time.Now()
	if r.first.IsZero() {
		r.first = now
	}
	r.due = now.Add(quiet)
	if latest := r.first.Add(limit); latest.Before(r.due) {
		r.due = latest
	}
	r.arm()
}

// arm sets the timer to the earliest of the pending reload and the write
// timeouts of files left open.
func (r *run) arm() {
	var next time.Time
	if r.reloadPending() {
		next = r.due
	}
	for _, t := range r.writing {
		if at := t.Add(r.tune.writeQuiet); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	r.timer.Stop()
	if !next.IsZero() {
		r.timer.Reset(max(time.Until(next), 0))
	}
}

// fire reads files left open past their write timeout and reloads the
// pending events once they are due.
func (r *run) fire() {
	now := time.Now()
	for path, t := range r.writing {
		if now.Sub(t) >= r.tune.writeQuiet {
			delete(r.writing, path)
			r.log.Info("Manifest file still open for writing but unchanged; reading it as it is",
				"file", path, "unchangedFor", r.tune.writeQuiet)
			r.pending[path] = true
			if r.first.IsZero() {
				r.due = now
			}
		}
	}
	if r.reloadPending() && !now.Before(r.due) {
		r.flush()
	}
	r.arm()
}

// reloadPending reports whether a reload is scheduled.
func (r *run) reloadPending() bool {
	return len(r.pending) > 0 || r.full || r.back
}

// flush reloads what changed and delivers the resulting changes. While
// source.path is gone nothing is read and nothing delivered.
func (r *run) flush() {
	full, pending := r.full || r.back, r.pending
	r.full, r.pending, r.first = false, map[string]bool{}, time.Time{}
	if r.down != nil {
		return
	}
	if err := checkDir(r.tree.root); err != nil {
		r.goDown(err)
		return
	}
	if full {
		if err := r.rescan(); err != nil {
			r.goDown(err)
			return
		}
	} else {
		r.reload(pending)
	}
	changes := r.st.diff()
	deliver(r.h, changes)
	if r.back {
		r.back = false
		r.log.Info("Read the manifest folder again", "path", r.tree.root, "files", len(r.st.files))
		if r.reporter != nil {
			r.reporter.OnSourceUp()
		}
	}
	if len(changes) == 0 {
		r.log.Debug("Reloaded manifests; nothing changed", "path", r.tree.root)
		return
	}
	added, updated, deleted := counts(changes)
	r.log.Info("Applied manifest changes", "path", r.tree.root,
		"added", added, "updated", updated, "deleted", deleted)
}

// checkRoot notices source.path going away, coming back, or leading to
// another folder (a symbolic link re-pointed).
func (r *run) checkRoot() {
	err := checkDir(r.tree.root)
	switch {
	case err != nil:
		r.goDown(err)
	case r.down != nil:
		r.log.Info("Manifest folder is back; reading it once it has settled", "path", r.tree.root)
		r.down, r.back = nil, true
		r.tree.rewatchAll() // to see it being filled
		r.schedule()
	default:
		if real, err := filepath.EvalSymlinks(r.tree.root); err == nil && real != r.real && !r.back {
			r.log.Info("source.path leads to another folder now; reading it", "path", r.tree.root, "was", r.real, "now", real)
			r.full = true
			r.schedule()
		}
	}
}

// goDown records that source.path cannot be read: the objects last
// delivered stay, nothing is read until it is back, and the handler hears
// of it.
func (r *run) goDown(err error) {
	if r.down != nil && r.down.Error() == err.Error() {
		return
	}
	if r.down == nil {
		r.log.Warn("Manifest folder is gone; keeping its objects and the rules, waiting for it to come back",
			"path", r.tree.root, "error", err)
	}
	r.down, r.back, r.full = err, false, false
	clear(r.pending)
	clear(r.writing)
	r.first = time.Time{}
	if r.reporter != nil {
		r.reporter.OnSourceDown(err)
	}
}

// rescan walks the whole directory again and re-reads every file but
// those being written.
func (r *run) rescan() error {
	if err := checkDir(r.tree.root); err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(r.tree.root); err == nil {
		r.real = real
	}
	files := r.tree.rewatchAll()
	r.st.dropFilesNotIn(files)
	r.st.loadFiles(r.readable(files))
	return nil
}

// reload re-reads the files behind the changed paths: a path may be a file,
// a new directory to walk, or a removed directory whose files are gone.
func (r *run) reload(paths map[string]bool) {
	load := map[string]bool{}
	for path := range paths {
		r.tree.unwatchGone(path)
		if info, err := os.Stat(path); err == nil && info.IsDir() {
			maps.Copy(load, r.tree.walk(path))
		} else if isManifest(path) {
			load[path] = true
		}
		for _, f := range r.st.filesUnder(path) {
			load[f] = true
		}
	}
	r.st.loadFiles(r.readable(load))
}

// readable returns the files to read, sorted, without those being written.
func (r *run) readable(files map[string]bool) []string {
	out := make([]string, 0, len(files))
	for f := range files {
		if _, busy := r.writing[f]; !busy {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// logLoaded logs a summary of the initial load.
func (r *run) logLoaded(changes []change) {
	var n [3]int
	for _, c := range changes {
		n[c.key.kind]++
	}
	r.log.Info("Loaded manifests", "path", r.tree.root, "files", len(r.st.files),
		"nodes", n[kindNode], "services", n[kindService], "endpointSlices", n[kindEndpointSlice])
}
