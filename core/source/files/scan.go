package files

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// tree finds manifest files under the root and keeps a watch on every
// directory it walks.
type tree struct {
	root    string
	log     *slog.Logger
	watcher *watcher
	dirs    map[string]bool // watched directories, by path under root
	warned  map[string]bool // links already warned about
}

// walk returns the manifest files under start and watches each directory it
// enters. Hidden names are skipped; symbolic links to files and directories
// are followed (a ConfigMap mount's top-level names are links into ..data),
// each real directory at most once so link loops end. A link that loops,
// or that cannot be followed, is warned about once.
func (t *tree) walk(start string) map[string]bool {
	files := map[string]bool{}
	visited := map[string]bool{}
	var visit func(dir string, above []string)
	visit = func(dir string, above []string) {
		real, err := filepath.EvalSymlinks(dir)
		switch {
		case err != nil:
			t.warnLink(dir, "Cannot follow a link to a manifest folder; skipping it", err)
			return
		case slices.Contains(above, real):
			t.warnLink(dir, "Skipping a link that loops back to a folder above it", fmt.Errorf("leads to %s", real))
			return
		case visited[real]:
			t.log.Debug("Skipping a folder already read through another path", "dir", dir, "real", real)
			return
		}
		visited[real] = true
		t.watch(dir) // before listing, so files created meanwhile raise events
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.log.Warn("Cannot read manifest directory", "dir", dir, "error", err)
			return
		}
		for _, e := range entries {
			if isHidden(e.Name()) {
				continue
			}
			path := filepath.Join(dir, e.Name())
			switch mode := t.entryType(path, e); {
			case mode.IsDir():
				visit(path, append(slices.Clip(above), real))
			case mode.IsRegular() && isManifest(e.Name()):
				files[path] = true
			}
		}
	}
	visit(start, nil)
	return files
}

// warnLink warns once about a symbolic link the walk skips.
func (t *tree) warnLink(path, msg string, err error) {
	if t.warned[path] {
		return
	}
	t.warned[path] = true
	t.log.Warn(msg, "path", path, "error", err)
}

// entryType returns the type of a directory entry, following a symbolic
// link; a broken link reports as irregular so it is skipped, and one that
// loops is warned about once.
func (t *tree) entryType(path string, e fs.DirEntry) fs.FileMode {
	if e.Type()&fs.ModeSymlink == 0 {
		return e.Type()
	}
	info, err := os.Stat(path)
	if errors.Is(err, syscall.ELOOP) {
		t.warnLink(path, "Skipping a symbolic link loop", err)
	}
	if err != nil {
		return fs.ModeIrregular
	}
	return info.Mode().Type()
}

// isHidden reports whether a file name is hidden (starts with a dot).
func isHidden(name string) bool {
	return strings.HasPrefix(name, ".")
}

// isAtomicWriterName reports whether a name belongs to the ..data layout a
// kubelet ConfigMap or Secret volume swaps atomically.
func isAtomicWriterName(name string) bool {
	return strings.HasPrefix(name, "..")
}

// watch adds an fsnotify watch on dir. Adding a path that is already watched
// re-resolves it, which picks up a symbolic link that now points elsewhere.
// A tree without a watcher (a one-time read) watches nothing.
func (t *tree) watch(dir string) {
	if t.watcher == nil {
		return
	}
	if err := t.watcher.add(dir); err != nil {
		t.log.Warn("Cannot watch manifest directory", "dir", dir, "error", err)
		return
	}
	t.dirs[dir] = true
}

// rewatchAll walks the whole root again, drops the watches on directories that
// are gone and returns every manifest file.
func (t *tree) rewatchAll() map[string]bool {
	old := t.dirs
	t.dirs = map[string]bool{}
	files := t.walk(t.root)
	for dir := range old {
		if !t.dirs[dir] {
			t.watcher.remove(dir) // usually already gone with its directory
		}
	}
	return files
}

// unwatchGone drops the watches on path and directories below it that are no
// longer directories.
func (t *tree) unwatchGone(path string) {
	prefix := path + string(os.PathSeparator)
	for dir := range t.dirs {
		if dir != path && !strings.HasPrefix(dir, prefix) {
			continue
		}
		if info, err := os.Stat(dir); err == nil && info.IsDir() {
			continue
		}
		t.watcher.remove(dir)
		delete(t.dirs, dir)
	}
}
