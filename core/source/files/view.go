package files

import (
	"cmp"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/weirproxy/weir/core/source"
)

// state is what one Run knows: the objects each file defines, and the
// effective objects last delivered to the handler.
type state struct {
	log   *slog.Logger
	files map[string]objects // by file path
	view  map[key]*entry     // effective objects, as delivered
	dups  map[key]string     // duplicate definitions already warned about
	rv    uint64             // last resource version handed out
}

// entry is one delivered object and the decoded object it was made from.
type entry struct {
	src object // as decoded from the winning file; compared on reload
	out object // a copy of src with a resource version, given to the handler
}

// change is one object's transition; prev is nil for an add, cur for a delete.
type change struct {
	key       key
	prev, cur object
}

// newState returns an empty state.
func newState(log *slog.Logger) *state {
	return &state{
		log:   log,
		files: map[string]objects{},
		view:  map[key]*entry{},
		dups:  map[key]string{},
	}
}

// loadFile re-reads one file. A file that is gone drops its objects; a file
// that cannot be read keeps them.
func (st *state) loadFile(path string) {
	info, err := os.Stat(path)
	if err == nil && !info.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	var data []byte
	if err == nil {
		data, err = os.ReadFile(path)
	}
	if isGone(err) {
		delete(st.files, path)
		return
	}
	if err != nil {
		st.log.Warn("Cannot read manifest file; keeping its last good objects", "file", path, "error", err)
		return
	}
	objs, failures := decodeFile(st.log, path, data)
	if failures > 0 {
		st.keepPrevious(path, objs)
	}
	if len(objs) == 0 {
		delete(st.files, path)
		return
	}
	st.files[path] = objs
}

// isGone reports whether err means the file no longer exists.
func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// keepPrevious adds to objs the objects path defined before that it no longer
// yields: a document that failed to parse may be one of them mid-edit, so a
// broken document never deletes anything.
func (st *state) keepPrevious(path string, objs objects) {
	kept := 0
	for k, o := range st.files[path] {
		if _, ok := objs[k]; !ok {
			objs[k] = o
			kept++
		}
	}
	if kept > 0 {
		st.log.Warn("Manifest file has errors; keeping the last good definitions of its other objects",
			"file", path, "kept", kept)
	}
}

// dropFilesNotIn forgets every file that is not in keep.
func (st *state) dropFilesNotIn(keep map[string]bool) {
	for path := range st.files {
		if !keep[path] {
			delete(st.files, path)
		}
	}
}

// filesUnder returns the known files that are path itself or inside it.
func (st *state) filesUnder(path string) []string {
	var out []string
	prefix := path + string(os.PathSeparator)
	for f := range st.files {
		if f == path || strings.HasPrefix(f, prefix) {
			out = append(out, f)
		}
	}
	return out
}

// effective merges the file sets: for an object defined in several files, the
// lexically last path wins.
func (st *state) effective() map[key]object {
	eff := map[key]object{}
	from := map[key][]string{}
	for _, path := range slices.Sorted(maps.Keys(st.files)) {
		for k, o := range st.files[path] {
			eff[k] = o
			from[k] = append(from[k], path)
		}
	}
	st.reportDuplicates(from)
	return eff
}

// reportDuplicates warns once about each object defined in more than one file.
func (st *state) reportDuplicates(from map[key][]string) {
	dups := map[key]string{}
	for k, paths := range from {
		if len(paths) > 1 {
			dups[k] = strings.Join(paths, "\n")
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(dups), cmpKeys) {
		if st.dups[k] == dups[k] {
			continue
		}
		paths := from[k]
		last := len(paths) - 1
		st.log.Warn("Object defined in more than one file; the lexically last file wins",
			"object", k.String(), "file", paths[last], "ignored", paths[:last])
	}
	st.dups = dups
}

// cmpKeys orders keys by kind, namespace and name.
func cmpKeys(a, b key) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
}

// diff compares the effective objects with the delivered ones and returns the
// changes in delivery order, with new objects stamped and recorded as delivered.
func (st *state) diff() []change {
	eff := st.effective()
	var changes []change
	for k, o := range eff {
		e := st.view[k]
		switch {
		case e == nil:
			changes = append(changes, change{key: k, cur: o})
		case e.src == o:
			// Same decoded object: its file was not re-read.
		case apiequality.Semantic.DeepEqual(e.src, o):
			e.src = o
		default:
			changes = append(changes, change{key: k, prev: e.out, cur: o})
		}
	}
	for k, e := range st.view {
		if _, ok := eff[k]; !ok {
			changes = append(changes, change{key: k, prev: e.out})
		}
	}
	slices.SortFunc(changes, deliveryOrder)
	for i := range changes {
		st.record(&changes[i])
	}
	return changes
}

// deliveryOrder puts additions and updates first (Nodes, Services, then
// EndpointSlices), then deletions in the reverse kind order.
func deliveryOrder(a, b change) int {
	aDel, bDel := a.cur == nil, b.cur == nil
	switch {
	case aDel != bDel:
		if aDel {
			return 1
		}
		return -1
	case aDel:
		return cmp.Or(cmp.Compare(b.key.kind, a.key.kind), cmpKeys(a.key, b.key))
	}
	return cmpKeys(a.key, b.key)
}

// record updates the delivered view for c and replaces c.cur with the stamped
// copy the handler will see.
func (st *state) record(c *change) {
	if c.cur == nil {
		delete(st.view, c.key)
		return
	}
	st.rv++
	out := c.cur.DeepCopyObject().(object)
	out.SetResourceVersion(strconv.FormatUint(st.rv, 10))
	st.view[c.key] = &entry{src: c.cur, out: out}
	c.cur = out
}

// deliver calls the handler for each change, in order.
func deliver(h source.Handler, changes []change) {
	for _, c := range changes {
		switch c.key.kind {
		case kindNode:
			prev, _ := c.prev.(*corev1.Node)
			cur, _ := c.cur.(*corev1.Node)
			h.OnNode(prev, cur)
		case kindService:
			prev, _ := c.prev.(*corev1.Service)
			cur, _ := c.cur.(*corev1.Service)
			h.OnService(prev, cur)
		case kindEndpointSlice:
			prev, _ := c.prev.(*discoveryv1.EndpointSlice)
			cur, _ := c.cur.(*discoveryv1.EndpointSlice)
			h.OnEndpointSlice(prev, cur)
		}
	}
}

// counts tallies changes as added, updated and deleted for logging.
func counts(changes []change) (added, updated, deleted int) {
	for _, c := range changes {
		switch {
		case c.prev == nil:
			added++
		case c.cur == nil:
			deleted++
		default:
			updated++
		}
	}
	return added, updated, deleted
}
