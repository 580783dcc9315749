package files

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/core/source"
)

// state is what one Run knows: the objects each file defines, which files
// define each object, and the effective objects last delivered to the handler.
//
// Work per reload is proportional to the files re-read: loading a file marks
// the keys it defined before or defines now as dirty, and diff looks at those
// keys only. Each object exists once; the delivered one is also the one its
// winning file holds, stamped with a resource version when first delivered.
//
// Memory is one entry per object and one list of keys per file: at 10k
// services the bookkeeping is a few megabytes beside the objects.
type state struct {
	log     *slog.Logger
	compact *source.Compactor // makes the records of every file's objects
	objs    map[key]*entry    // every object some file defines or that was delivered
	files   map[string][]key  // by file path: the objects the file defines
	dirs    map[string]int    // how many known files each directory holds
	dirty   map[key]bool      // objects to compare at the next diff
	dups    map[key]string    // duplicate definitions already warned about
	rv      uint64            // last resource version handed out
}

// entry is one object: its definitions, sorted by path (the last one wins),
// and the object last delivered, if any.
type entry struct {
	owners []definition
	view   object
}

// definition is an object as one file defines it.
type definition struct {
	path string
	obj  object
}

// change is one object's transition; prev is nil for an add, cur for a delete.
type change struct {
	key       key
	prev, cur object
}

// newState returns an empty state.
func newState(log *slog.Logger) *state {
	return &state{
		log:     log,
		compact: source.NewCompactor(),
		objs:    map[key]*entry{},
		files:   map[string][]key{},
		dirs:    map[string]int{},
		dirty:   map[key]bool{},
		dups:    map[key]string{},
	}
}

// setFile records the objects path now defines (none if it is gone) and
// marks every object it defined before or defines now as dirty.
func (st *state) setFile(path string, objs objects) {
	old := st.files[path]
	for _, k := range old {
		if _, ok := objs[k]; !ok {
			st.disown(k, path)
		}
		st.dirty[k] = true
	}
	keys := make([]key, 0, len(objs))
	for k, obj := range objs {
		st.own(k, path, obj)
		st.dirty[k] = true
		keys = append(keys, k)
	}
	dir := filepath.Dir(path)
	switch {
	case len(objs) > 0:
		if old == nil {
			st.dirs[dir]++
		}
		st.files[path] = keys
	case old != nil:
		delete(st.files, path)
		if st.dirs[dir]--; st.dirs[dir] == 0 {
			delete(st.dirs, dir)
		}
	}
}

// own records that path defines k as obj.
func (st *state) own(k key, path string, obj object) {
	e := st.objs[k]
	if e == nil {
		e = &entry{}
		st.objs[k] = e
	}
	i, found := slices.BinarySearchFunc(e.owners, path, byPath)
	if found {
		e.owners[i].obj = obj
		return
	}
	e.owners = slices.Insert(e.owners, i, definition{path: path, obj: obj})
}

// disown removes path from the files defining k.
func (st *state) disown(k key, path string) {
	e := st.objs[k]
	if e == nil {
		return
	}
	if i, found := slices.BinarySearchFunc(e.owners, path, byPath); found {
		e.owners = slices.Delete(e.owners, i, i+1)
	}
	if len(e.owners) == 0 {
		e.owners = nil
	}
}

// byPath orders definitions by the path of their file.
func byPath(d definition, path string) int { return strings.Compare(d.path, path) }

// defined returns the object path defines as k, or nil.
func (st *state) defined(path string, k key) object {
	if e := st.objs[k]; e != nil {
		if i, found := slices.BinarySearchFunc(e.owners, path, byPath); found {
			return e.owners[i].obj
		}
	}
	return nil
}

// dropFilesNotIn forgets every file that is not in keep.
func (st *state) dropFilesNotIn(keep map[string]bool) {
	for path := range st.files {
		if !keep[path] {
			st.setFile(path, nil)
		}
	}
}

// filesUnder returns the known files that are path itself or inside it. It
// looks through every known file only if path is a directory holding some,
// as when such a directory is removed or renamed.
func (st *state) filesUnder(path string) []string {
	prefix := path + string(os.PathSeparator)
	if !st.holdsFiles(path, prefix) {
		if _, ok := st.files[path]; ok {
			return []string{path}
		}
		return nil
	}
	var out []string
	for f := range st.files {
		if f == path || strings.HasPrefix(f, prefix) {
			out = append(out, f)
		}
	}
	return out
}

// holdsFiles reports whether a directory at path, with the given prefix,
// holds known files at any depth.
func (st *state) holdsFiles(path, prefix string) bool {
	for dir := range st.dirs {
		if dir == path || strings.HasPrefix(dir, prefix) {
			return true
		}
	}
	return false
}

// effective returns the object the lexically last file defining k gives it,
// and that file; the object is nil if no file defines k.
func (st *state) effective(k key) (object, string) {
	e := st.objs[k]
	if e == nil || len(e.owners) == 0 {
		return nil, ""
	}
	d := e.owners[len(e.owners)-1]
	return d.obj, d.path
}

// setEffective replaces the object the winning file defines for k.
func (st *state) setEffective(k key, obj object) {
	e := st.objs[k]
	e.owners[len(e.owners)-1].obj = obj
}

// reportDuplicates warns once about each object in keys whose set of defining
// files changed to more than one.
func (st *state) reportDuplicates(keys map[key]bool) {
	var warn []key
	for k := range keys {
		paths := st.paths(k)
		if len(paths) < 2 {
			delete(st.dups, k)
			continue
		}
		if joined := strings.Join(paths, "\n"); st.dups[k] != joined {
			st.dups[k] = joined
			warn = append(warn, k)
		}
	}
	slices.SortFunc(warn, cmpKeys)
	for _, k := range warn {
		paths := st.paths(k)
		last := len(paths) - 1
		st.log.Warn("Object defined in more than one file; the lexically last file wins",
			"object", k.String(), "file", paths[last], "ignored", slices.Clone(paths[:last]))
	}
}

// paths returns the files defining k, sorted.
func (st *state) paths(k key) []string {
	var out []string
	if e := st.objs[k]; e != nil {
		for _, d := range e.owners {
			out = append(out, d.path)
		}
	}
	return out
}

// cmpKeys orders keys by kind, namespace and name.
func cmpKeys(a, b key) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
}

// diff compares the effective objects of the dirty keys with the delivered
// ones and returns the changes in delivery order, with new objects stamped and
// recorded as delivered.
func (st *state) diff() []change {
	st.reportDuplicates(st.dirty)
	var changes []change
	for k := range st.dirty {
		if c, ok := st.compare(k); ok {
			changes = append(changes, c)
		}
	}
	slices.SortFunc(changes, deliveryOrder)
	for i := range changes {
		st.record(&changes[i])
	}
	for k := range st.dirty {
		if e := st.objs[k]; e != nil && len(e.owners) == 0 && e.view == nil {
			delete(st.objs, k)
		}
	}
	// A new map rather than clear: the initial load's would keep room for
	// every object.
	st.dirty = map[key]bool{}
	return changes
}

// compare returns the change of k since it was last delivered, if any.
func (st *state) compare(k key) (change, bool) {
	cur, _ := st.effective(k)
	var prev object
	if e := st.objs[k]; e != nil {
		prev = e.view
	}
	switch {
	case prev == nil && cur == nil:
		return change{}, false
	case prev == nil || cur == nil:
		return change{key: k, prev: prev, cur: cur}, true
	case prev == cur:
		return change{}, false // the winning file still holds what was delivered
	case sameContent(prev, cur):
		st.setEffective(k, prev) // drop the new copy; keep the delivered one
		return change{}, false
	}
	return change{key: k, prev: prev, cur: cur}, true
}

// sameContent reports whether two records of one kind are equal apart
// from their resource versions.
func sameContent(a, b object) bool {
	switch x := a.(type) {
	case *source.Service:
		y, ok := b.(*source.Service)
		return ok && x.Same(y)
	case *source.EndpointSlice:
		y, ok := b.(*source.EndpointSlice)
		return ok && x.Same(y)
	case *source.Node:
		y, ok := b.(*source.Node)
		return ok && x.Same(y)
	}
	return false
}

// withResourceVersion returns a shallow copy of obj with another resource
// version: the copy shares everything else with obj, which nobody modifies.
func withResourceVersion(obj object, rv string) object {
	switch o := obj.(type) {
	case *source.Service:
		c := *o
		c.ResourceVersion = rv
		return &c
	case *source.EndpointSlice:
		c := *o
		c.ResourceVersion = rv
		return &c
	case *source.Node:
		c := *o
		c.ResourceVersion = rv
		return &c
	}
	panic(fmt.Sprintf("files source: no record type %T", obj))
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

// record updates the delivered view for c and stamps c.cur with the next
// resource version. An object stamped before was handed to the handler
// already, so it is copied rather than changed (a shallow copy: delivered
// objects are never modified, so the copy shares all but its metadata's
// resource version), and the copy replaces it in its file.
func (st *state) record(c *change) {
	e := st.objs[c.key]
	if c.cur == nil {
		e.view = nil
		return
	}
	st.rv++
	if c.cur.GetResourceVersion() != "" {
		c.cur = withResourceVersion(c.cur, "")
		st.setEffective(c.key, c.cur)
	}
	c.cur.SetResourceVersion(strconv.FormatUint(st.rv, 10))
	e.view = c.cur
}

// deliver calls the handler for each change, in order.
func deliver(h source.RecordHandler, changes []change) {
	for _, c := range changes {
		switch c.key.kind {
		case kindNode:
			prev, _ := c.prev.(*source.Node)
			cur, _ := c.cur.(*source.Node)
			h.OnNodeRecord(prev, cur)
		case kindService:
			prev, _ := c.prev.(*source.Service)
			cur, _ := c.cur.(*source.Service)
			h.OnServiceRecord(prev, cur)
		case kindEndpointSlice:
			prev, _ := c.prev.(*source.EndpointSlice)
			cur, _ := c.cur.(*source.EndpointSlice)
			h.OnEndpointSliceRecord(prev, cur)
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
