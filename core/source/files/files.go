// Package files is the source that reads ordinary Kubernetes manifests
// (Services, EndpointSlices and Nodes) from a directory and watches it, so
// Weir can run with no cluster at all.
//
// Every *.yaml, *.yml and *.json file below the directory counts, following
// symbolic links and skipping hidden names, which fits a ConfigMap volume's
// ..data layout. YAML files may hold several documents, and a document may be
// a List. When two files define the same object, the lexically last path
// wins. A document that cannot be parsed is logged and skipped; it never
// deletes what its file defined before.
//
// Changes are seen through fsnotify watches on the directory and every
// directory below it. A link to a file outside those directories is read, but
// edits to its target go unnoticed until the link itself changes or a
// ConfigMap-style ..data swap triggers a full rescan.
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

	"github.com/fsnotify/fsnotify"

	"github.com/weirproxy/weir/core/source"
)

const (
	// debounce is how long the directory must stay quiet before a reload.
	debounce = 10 * time.Millisecond
	// maxDelay bounds how long a stream of events can postpone a reload.
	maxDelay = time.Second
)

// Source reads Kubernetes manifests from a directory and delivers their changes.
type Source struct {
	dir string
	log *slog.Logger
}

var _ source.Source = (*Source)(nil)

// New returns a source that reads Kubernetes manifests from dir.
func New(dir string, log *slog.Logger) *Source {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{dir: filepath.Clean(dir), log: log}
}

// Run loads every manifest, delivers the objects to h (Nodes, then Services,
// then EndpointSlices) and calls h.OnSynced; it then delivers each change to
// the directory until ctx is done, when it returns nil. It fails if the
// directory is missing at start or removed later. All calls to h come from
// the goroutine that called Run.
func (s *Source) Run(ctx context.Context, h source.Handler) error {
	if err := checkDir(s.dir); err != nil {
		return err
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("files source: watching source.path %q: %w", s.dir, err)
	}
	defer watcher.Close()
	r := newRun(s, watcher)
	defer r.timer.Stop()
	if err := r.rescan(); err != nil {
		return err
	}
	changes := r.st.diff()
	deliver(h, changes)
	r.logLoaded(changes)
	h.OnSynced()
	return r.loop(ctx, h)
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
	log     *slog.Logger
	tree    *tree
	st      *state
	pending map[string]bool // paths with events since the last reload
	full    bool            // rescan everything at the next reload
	first   time.Time       // when the oldest pending event arrived
	timer   *time.Timer     // fires the next reload
}

// newRun returns a run with a stopped reload timer.
func newRun(s *Source, watcher *fsnotify.Watcher) *run {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &run{
		log:     s.log,
		tree:    &tree{root: s.dir, log: s.log, watcher: watcher, dirs: map[string]bool{}},
		st:      newState(s.log),
		pending: map[string]bool{},
		timer:   timer,
	}
}

// loop handles file events until ctx is done.
func (r *run) loop(ctx context.Context, h source.Handler) error {
	w := r.tree.watcher
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("files source: file watcher closed")
			}
			r.note(ev)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("files source: file watcher closed")
			}
			r.log.Warn("File watch error; rescanning manifests", "path", r.tree.root, "error", err)
			r.full = true
			r.arm()
		case <-r.timer.C:
			if err := r.flush(h); err != nil {
				return err
			}
		}
	}
}

// note records one file event and arms the reload timer.
func (r *run) note(ev fsnotify.Event) {
	name := filepath.Clean(ev.Name)
	base := filepath.Base(name)
	switch {
	case name == r.tree.root:
		if !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
			return
		}
		r.full = true
	case isAtomicWriterName(base):
		r.full = true // a ConfigMap volume swapped its ..data link
	case isHidden(base):
		return // editor swap files and the like
	default:
		r.pending[name] = true
	}
	r.arm()
}

// arm schedules a reload debounce after now, but no later than maxDelay
// after the oldest pending event.
func (r *run) arm() {
	now := time.Now()
	if r.first.IsZero() {
		r.first = now
	}
	delay := min(debounce, maxDelay-now.Sub(r.first))
	r.timer.Reset(max(delay, 0))
}

// flush reloads what changed and delivers the resulting changes.
func (r *run) flush(h source.Handler) error {
	full, pending := r.full, r.pending
	r.full, r.pending, r.first = false, map[string]bool{}, time.Time{}
	if full {
		if err := r.rescan(); err != nil {
			return err
		}
	} else {
		r.reload(pending)
	}
	changes := r.st.diff()
	deliver(h, changes)
	if len(changes) == 0 {
		r.log.Debug("Reloaded manifests; nothing changed", "path", r.tree.root)
		return nil
	}
	added, updated, deleted := counts(changes)
	r.log.Info("Applied manifest changes", "path", r.tree.root,
		"added", added, "updated", updated, "deleted", deleted)
	return nil
}

// rescan walks the whole directory again and re-reads every file.
func (r *run) rescan() error {
	if err := checkDir(r.tree.root); err != nil {
		return err
	}
	files := r.tree.rewatchAll()
	r.st.dropFilesNotIn(files)
	r.st.loadFiles(slices.Sorted(maps.Keys(files)))
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
	r.st.loadFiles(slices.Sorted(maps.Keys(load)))
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
