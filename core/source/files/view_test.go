package files

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/internal/syncbuf"
)

// testNode returns the record of a Node whose content is its zone v.
func testNode(name, v string) *source.Node {
	return &source.Node{Meta: source.Meta{Name: name}, Zone: v}
}

// snapshot is what an object looked like when it was delivered.
type snapshot struct {
	obj   object
	rv, v string
}

// TestIncrementalDiffMatchesFullMerge changes random files at random and
// checks each diff against a merge of every file computed from scratch: the
// lexically last file wins, changes chain from what was delivered before,
// unchanged content is not delivered again, the winning file holds the very
// object delivered, duplicates are reported once per change of the files
// defining an object, and delivered objects never change.
func TestIncrementalDiffMatchesFullMerge(t *testing.T) {
	logs := &syncbuf.Buffer{}
	st := newState(slog.New(slog.NewTextHandler(logs, nil)))
	rnd := rand.New(rand.NewPCG(5, 6))
	paths := []string{"/m/a.yaml", "/m/b.yaml", "/m/sub/c.yaml", "/m/d.yaml"}
	names := []string{"n1", "n2", "n3"}
	model := map[string]map[string]string{} // path -> node name -> v
	delivered := map[key]object{}
	var seen []snapshot
	lastDup := map[string]string{}
	dupWarnings := 0
	for step := range 3000 {
		for range 1 + rnd.IntN(2) {
			path := paths[rnd.IntN(len(paths))]
			objs, defs := objects{}, map[string]string{}
			for _, n := range names {
				if rnd.IntN(2) == 0 {
					v := fmt.Sprint(rnd.IntN(3))
					objs[key{kind: kindNode, name: n}], defs[n] = testNode(n, v), v
				}
			}
			st.setFile(path, objs)
			model[path] = defs
		}
		for _, c := range st.diff() {
			if delivered[c.key] != c.prev {
				t.Fatalf("step %d: %v: prev is not the object delivered before", step, c.key)
			}
			if c.prev != nil && c.cur != nil && label(c.prev) == label(c.cur) {
				t.Fatalf("step %d: %v: update without a change", step, c.key)
			}
			if c.cur == nil {
				delete(delivered, c.key)
				continue
			}
			delivered[c.key] = c.cur
			seen = append(seen, snapshot{obj: c.cur, rv: c.cur.GetResourceVersion(), v: label(c.cur)})
		}
		want, owners := mergeModel(model)
		got := map[string]string{}
		for k, o := range delivered {
			got[k.name] = label(o)
			if cur, _ := st.effective(k); cur != o {
				t.Fatalf("step %d: %v: the winning file holds another copy of the delivered object", step, k)
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: delivered %v, want %v", step, got, want)
		}
		for _, n := range names {
			joined := strings.Join(owners[n], "\n")
			if len(owners[n]) < 2 {
				delete(lastDup, n)
			} else if lastDup[n] != joined {
				lastDup[n] = joined
				dupWarnings++
			}
		}
		for _, s := range seen {
			if s.obj.GetResourceVersion() != s.rv || label(s.obj) != s.v {
				t.Fatalf("step %d: a delivered object changed", step)
			}
		}
	}
	if n := strings.Count(logs.String(), "defined in more than one file"); n != dupWarnings {
		t.Errorf("%d duplicate warnings, want %d", n, dupWarnings)
	}
}

// label returns a test Node's content.
func label(o object) string { return o.(*source.Node).Zone }

// mergeModel returns each node's content from the lexically last file that
// defines it, and the files defining each node.
func mergeModel(model map[string]map[string]string) (map[string]string, map[string][]string) {
	merged, owners := map[string]string{}, map[string][]string{}
	for _, path := range slices.Sorted(maps.Keys(model)) {
		for n, v := range model[path] {
			merged[n] = v
			owners[n] = append(owners[n], path)
		}
	}
	return merged, owners
}

func TestUnchangedObjectsKeepTheirIdentity(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.1"))
	initial := h.start()
	svc, slice := initial[0].cur, initial[1].cur

	expectEvents(t, h.settle(func() {
		h.write("web.yaml", "# touched\n"+webService+"---\n"+webSlice("10.0.0.1"))
	}))
	evs := h.settle(func() { h.write("web.yaml", webService+"---\n"+webSlice("10.0.0.2")) })
	expectEvents(t, evs, "update EndpointSlice default/web-1")
	if evs[0].prev != slice {
		t.Errorf("update's prev is not the EndpointSlice delivered first")
	}
	evs = h.settle(func() { h.write("web.yaml", strings.Replace(webService, "port: 80", "port: 81", 1)) })
	expectEvents(t, evs, "update Service default/web", "delete EndpointSlice default/web-1")
	if evs[0].prev != svc {
		t.Errorf("update's prev is not the Service delivered first")
	}
}

func TestRedeliveredObjectIsACopy(t *testing.T) {
	h := newHarness(t)
	h.write("a.yaml", webService)
	a := h.start()[0].cur
	rvA := a.GetResourceVersion()

	evs := h.settle(func() { h.write("b.yaml", strings.Replace(webService, "port: 80", "port: 81", 1)) })
	expectEvents(t, evs, "update Service default/web")
	b := evs[0].cur

	evs = h.settle(func() { h.remove("b.yaml") })
	expectEvents(t, evs, "update Service default/web")
	again := evs[0].cur
	switch {
	case evs[0].prev != b:
		t.Errorf("prev is not b.yaml's Service")
	case again == a:
		t.Errorf("a.yaml's Service was delivered twice as the same object")
	case a.GetResourceVersion() != rvA:
		t.Errorf("a delivered object was changed: resource version %s -> %s", rvA, a.GetResourceVersion())
	case rv(t, again) <= rv(t, b):
		t.Errorf("resource version did not increase: %s -> %s", b.GetResourceVersion(), again.GetResourceVersion())
	}
	if port := again.(*source.Service).Ports[0].Port; port != 80 {
		t.Errorf("port = %d, want a.yaml's 80", port)
	}
}

func TestDuplicateWarnedOncePerChangeOfFiles(t *testing.T) {
	h := newHarness(t)
	h.write("a.yaml", webService)
	h.write("b.yaml", webService)
	h.start()
	warnings := func() int { return strings.Count(h.logs.String(), "defined in more than one file") }
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings at start, want 1", n)
	}
	evs := h.settle(func() { h.write("b.yaml", strings.Replace(webService, "port: 80", "port: 81", 1)) })
	expectEvents(t, evs, "update Service default/web")
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings after an edit, want still 1", n)
	}
	expectEvents(t, h.settle(func() { h.write("c.yaml", strings.Replace(webService, "port: 80", "port: 81", 1)) }))
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings after a third file, want 2", n)
	}
}

func TestDecodeLogsFollowPathOrder(t *testing.T) {
	h := newHarness(t)
	var want []string
	for i := range 40 {
		name := fmt.Sprintf("f%02d.yaml", i)
		h.write(name, webService+"---\nkind: [broken\n")
		want = append(want, h.path(name))
	}
	h.start()
	var got []string
	for line := range strings.Lines(h.logs.String()) {
		if strings.Contains(line, `msg="Skipping manifest"`) {
			file, _, _ := strings.Cut(strings.SplitN(line, " file=", 2)[1], " ")
			got = append(got, file)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("skipped documents logged in the order\n%v\nwant\n%v", got, want)
	}
}
