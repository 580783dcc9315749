package files

import (
	"cmp"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/weirproxy/weir/core/source"
)

// state is what one Run knows: the objects each file defines, which files
// define each object, and the effective objects last delivered to the handler.
//
// Work per reload is proportional to the files re-read: loading a file marks
// the keys it defined before or defines now as dirty, and diff looks at those
// keys only. Each object exists once; the delivered one is also the one its
// winning file holds, stamped with a resource version when first delivered.
type state struct {
	log    *slog.Logger
	files  map[string]objects // by file path
	dirs   map[string]int     // how many known files each directory holds
	owners map[key][]string   // files defining each object, sorted
	dirty  map[key]bool       // objects to compare at the next diff
	view   map[key]object     // effective objects, as delivered
	dups   map[key]string     // duplicate definitions already warned about
	rv     uint64             // last resource version handed out
}

// change is one object's transition; prev is nil for an add, cur for a delete.
type change struct {
	key       key
	prev, cur object
}

// newState returns an empty state.
func newState(log *slog.Logger) *state {
	return &state{
		log:    log,
		files:  map[string]objects{},
		dirs:   map[string]int{},
		owners: map[key][]string{},
		dirty:  map[key]bool{},
		view:   map[key]object{},
		dups:   map[key]string{},
	}
}

// setFile records the objects path now defines (none if it is gone) and
// marks every object it defined before or defines now as dirty.
func (st *state) setFile(path string, objs objects) {
	old := st.files[path]
	for k := range old {
		if _, ok := objs[k]; !ok {
			st.disown(k, path)
		}
		st.dirty[k] = true
	}
	for k := range objs {
		if _, ok := old[k]; !ok {
			st.own(k, path)
		}
		st.dirty[k] = true
	}
	dir := filepath.Dir(path)
	switch {
	case len(objs) > 0:
		if old == nil {
			st.dirs[dir]++
		}
		st.files[path] = objs
	case old != nil:
		delete(st.files, path)
		if st.dirs[dir]--; st.dirs[dir] == 0 {
			delete(st.dirs, dir)
		}
	}
}

// own adds path to the sorted list of files defining k.
func (st *state) own(k key, path string) {
	paths := st.owners[k]
	if i, found := slices.BinarySearch(paths, path); !found {
		st.owners[k] = slices.Insert(paths, i, path)
	}
}

// disown removes path from the files defining k.
func (st *state) disown(k key, path string) {
	paths := st.owners[k]
	i, found := slices.BinarySearch(paths, path)
	switch {
	case !found:
	case len(paths) == 1:
		delete(st.owners, k)
	default:
		st.owners[k] = slices.Delete(paths, i, i+1)
	}
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
	paths := st.owners[k]
	if len(paths) == 0 {
		return nil, ""
	}
	path := paths[len(paths)-1]
	return st.files[path][k], path
}

// reportDuplicates warns once about each object in keys whose set of defining
// files changed to more than one.
func (st *state) reportDuplicates(keys map[key]bool) {
	var warn []key
	for k := range keys {
		paths := st.owners[k]
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
		paths := st.owners[k]
		last := len(paths) - 1
		st.log.Warn("Object defined in more than one file; the lexically last file wins",
			"object", k.String(), "file", paths[last], "ignored", slices.Clone(paths[:last]))
	}
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
	clear(st.dirty)
	slices.SortFunc(changes, deliveryOrder)
	for i := range changes {
		st.record(&changes[i])
	}
	return changes
}

// compare returns the change of k since it was last delivered, if any.
func (st *state) compare(k key) (change, bool) {
	cur, path := st.effective(k)
	prev := st.view[k]
	switch {
	case prev == nil && cur == nil:
		return change{}, false
	case prev == nil || cur == nil:
		return change{key: k, prev: prev, cur: cur}, true
	case prev == cur:
		return change{}, false // the winning file still holds what was delivered
	case sameContent(prev, cur):
		st.files[path][k] = prev // drop the new copy; keep the delivered one
		return change{}, false
	}
	return change{key: k, prev: prev, cur: cur}, true
}

// sameContent reports whether two objects of one kind are equal apart from
// their resource versions.
func sameContent(a, b object) bool {
	if rv := a.GetResourceVersion(); b.GetResourceVersion() != rv {
		b = withResourceVersion(b, rv)
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

// withResourceVersion returns a shallow copy of obj with another resource
// version, for comparisons only: the copy shares everything else with obj.
func withResourceVersion(obj object, rv string) object {
	switch o := obj.(type) {
	case *corev1.Service:
		c := *o
		c.ResourceVersion = rv
		return &c
	case *discoveryv1.EndpointSlice:
		c := *o
		c.ResourceVersion = rv
		return &c
	case *corev1.Node:
		c := *o
		c.ResourceVersion = rv
		return &c
	}
	c := obj.DeepCopyObject().(object)
	c.SetResourceVersion(rv)
	return c
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
// already, so it is copied rather than changed, and the copy replaces it in
// its file.
func (st *state) record(c *change) {
	if c.cur == nil {
		delete(st.view, c.key)
		return
	}
	st.rv++
	if c.cur.GetResourceVersion() != "" {
		c.cur = c.cur.DeepCopyObject().(object)
		_, path := st.effective(c.key)
		st.files[path][c.key] = c.cur
	}
	c.cur.SetResourceVersion(strconv.FormatUint(st.rv, 10))
	st.view[c.key] = c.cur
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
