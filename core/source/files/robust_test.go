package files

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/source"
)

// quickRoot makes the source check source.path often and read a folder
// that came back soon.
func quickRoot(tu *tuning) {
	tu.rootPoll = 20 * time.Millisecond
	tu.returnQuiet = 50 * time.Millisecond
}

// A folder removed keeps its objects (no deletions), is reported down,
// and once recreated is read again: the differences, then up.
func TestFolderRemovedAndRecreated(t *testing.T) {
	h := newHarness(t)
	h.tune = quickRoot
	h.write("web.yaml", webService)
	h.write("slice.yaml", webSlice("10.0.0.1"))
	h.start()
	begin := len(h.rec.snapshot())
	if err := os.Rename(h.dir, h.dir+".old"); err != nil {
		t.Fatal(err)
	}
	evs := h.rec.waitFor(t, "Down", hasEvent("Down"))
	if err := evs[len(evs)-1].err; err == nil || !strings.Contains(err.Error(), "source.path") {
		t.Errorf("OnSourceDown(%v), want the reason naming source.path", err)
	}
	if err := os.Mkdir(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.write("web.yaml", strings.Replace(webService, "port: 80", "port: 81", 1))
	evs = h.rec.waitFor(t, "Up", hasEvent("Up"))
	expectEvents(t, evs[begin:], "Down", "update Service default/web", "delete EndpointSlice default/web-1", "Up")
	for _, want := range []string{"Manifest folder is gone", "Manifest folder is back", "Read the manifest folder again"} {
		if !strings.Contains(h.logs.String(), want) {
			t.Errorf("logs do not say %q:\n%s", want, h.logs)
		}
	}
	// It is watched again.
	evs = h.settle(func() { h.write("slice.yaml", webSlice("10.0.0.2")) })
	expectEvents(t, evs, "add EndpointSlice default/web-1")
}

// source.path is a symbolic link that a deployment tool re-points: the
// folder it leads to now is read.
func TestRootLinkRepointed(t *testing.T) {
	base := t.TempDir()
	for dir, files := range map[string]map[string]string{
		"a": {"web.yaml": webService},
		"b": {"web.yaml": strings.Replace(webService, "port: 80", "port: 81", 1),
			"db.yaml": strings.Replace(webService, "name: web", "name: db", 1)},
	} {
		for name, content := range files {
			if err := os.MkdirAll(filepath.Join(base, dir), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(base, dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	link := filepath.Join(base, "manifests")
	symlink(t, "a", link)
	h := newHarness(t)
	h.dir, h.tune = link, quickRoot
	expectEvents(t, h.start(), "add Service default/web", "Synced")
	begin := len(h.rec.snapshot())
	symlink(t, "b", link+".tmp") // what ln -sfn and deployment tools do
	if err := os.Rename(link+".tmp", link); err != nil {
		t.Fatal(err)
	}
	evs := h.rec.waitFor(t, "the new target's objects", hasEvent("add Service default/db"))
	expectEvents(t, evs[begin:], "add Service default/db", "update Service default/web")
	// Edits in the new target are seen, in the old one not.
	evs = h.settle(func() {
		if err := os.Remove(filepath.Join(base, "a", "web.yaml")); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(base, "b", "db.yaml")); err != nil {
			t.Fatal(err)
		}
	})
	expectEvents(t, evs, "delete Service default/db")
}

// manyServices returns a manifest of n services annotated with rev.
func manyServices(n, rev int) []byte {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-%d\n  annotations:\n    rev: \"%d\"\n"+
			"spec:\n  clusterIP: 10.96.%d.%d\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n", i, rev, i/250, i%250+1)
	}
	return []byte(b.String())
}

// serviceCounts returns the number of services after each event, from n.
func serviceCounts(evs []event, n int) []int {
	var out []int
	for _, e := range evs {
		if e.kind != "Service" {
			continue
		}
		switch e.op() {
		case "add":
			n++
		case "delete":
			n--
		}
		out = append(out, n)
	}
	return out
}

// revisions counts the services delivered last with each rev annotation.
func revisions(evs []event) map[string]int {
	last := map[string]string{}
	for _, e := range evs {
		switch {
		case e.kind != "Service":
		case e.cur == nil:
			delete(last, e.name())
		default:
			last[e.name()] = e.cur.(*source.Service).Annotations["rev"]
		}
	}
	counts := map[string]int{}
	for _, rev := range last {
		counts[rev]++
	}
	return counts
}

// A large manifest rewritten in place, slowly, chunk by chunk with fsync
// between, never loses a service on the way: the source reads the file
// once its writer closed it.
func TestSlowRewriteKeepsEveryService(t *testing.T) {
	const n = 200
	h := newHarness(t)
	h.write("many.yaml", string(manyServices(n, 1)))
	if got := len(h.start()); got != n+1 {
		t.Fatalf("%d events at start, want %d services and Synced", got, n)
	}
	begin := len(h.rec.snapshot())
	f, err := os.OpenFile(h.path("many.yaml"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := manyServices(n, 2)
	step := len(data)/10 + 1
	for off := 0; off < len(data); off += step {
		// The barrier around each chunk lets the source reload whatever
		// it would reload at that point.
		h.settle(func() {
			if _, err := f.Write(data[off:min(off+step, len(data))]); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	evs := h.rec.waitFor(t, "every service at rev 2", func(evs []event) bool {
		return revisions(evs)["2"] == n
	})
	for i, c := range serviceCounts(evs[begin:], n) {
		if c != n {
			t.Fatalf("after service event %d there were %d services, want %d all along:\n%s",
				i, c, n, eventStrings(evs[begin:]))
		}
	}
}

// A file a writer keeps open is read once it stayed unchanged for a while.
func TestFileLeftOpenIsReadWhenQuiet(t *testing.T) {
	h := newHarness(t)
	h.tune = func(tu *tuning) { tu.writeQuiet = 100 * time.Millisecond }
	h.start()
	f, err := os.Create(h.path("web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(webService); err != nil {
		t.Fatal(err)
	}
	h.rec.waitFor(t, "the open file's service", hasEvent("add Service default/web"))
	if !strings.Contains(h.logs.String(), "still open for writing but unchanged") {
		t.Errorf("logs do not say the file was read while open:\n%s", h.logs)
	}
}

// Symbolic link loops are skipped with one warning each, naming the link,
// however often the folder is scanned.
func TestLinkLoopsWarnedOnce(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService)
	h.write("sub/db.yaml", strings.Replace(webService, "name: web", "name: db", 1))
	symlink(t, ".", h.path("self"))
	symlink(t, "..", h.path("sub/up"))
	symlink(t, "l2", h.path("l1"))
	symlink(t, "l1", h.path("l2"))
	expectEvents(t, h.start(), "add Service default/db", "add Service default/web", "Synced")
	for range 2 { // a ..data change rescans everything
		h.settle(func() { h.write("..data", "") })
	}
	logs := h.logs.String()
	for _, w := range []struct{ msg, path string }{
		{"Skipping a link that loops back to a folder above it", h.path("self")},
		{"Skipping a link that loops back to a folder above it", h.path("sub/up")},
		{"Skipping a symbolic link loop", h.path("l1")},
		{"Skipping a symbolic link loop", h.path("l2")},
	} {
		line := fmt.Sprintf("msg=%q path=%s ", w.msg, w.path)
		if n := strings.Count(logs, line); n != 1 {
			t.Errorf("%d warnings %s, want 1:\n%s", n, line, logs)
		}
	}
}

// bigService returns a Service manifest named name whose annotation makes
// it size bytes or more.
func bigService(name string, size int) string {
	return "apiVersion: v1\nkind: Service\nmetadata:\n  name: " + name + "\n  namespace: prod\n  annotations:\n    blob: \"" +
		strings.Repeat("x", size) + "\"\nspec:\n  clusterIP: 10.96.0.99\n"
}

// An object over the size limit is skipped with a warning naming it; the
// other objects of its file are used, and its last good version is kept.
func TestOversizedObjectSkipped(t *testing.T) {
	h := newHarness(t)
	h.write("big.yaml", bigService("big", 10))
	expectEvents(t, h.start(), "add Service prod/big", "Synced")
	evs := h.settle(func() {
		h.write("big.yaml", bigService("big", maxObjectBytes)+"---\n"+webService)
		h.write("list.json", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service",`+
			`"metadata":{"name":"huge","annotations":{"a":"`+strings.Repeat("y", maxObjectBytes)+`"}}},`+
			`{"apiVersion":"v1","kind":"Service","metadata":{"name":"small"},"spec":{"clusterIP":"10.96.0.77"}}]}`)
	})
	slices.SortFunc(evs, func(a, b event) int { return strings.Compare(a.String(), b.String()) })
	expectEvents(t, evs, "add Service default/small", "add Service default/web")
	logs := h.logs.String()
	for _, want := range []string{
		`msg="Skipping a manifest object that is too large" file=` + h.path("big.yaml") + " document=1 kind=Service name=prod/big",
		`msg="Skipping a manifest object that is too large" file=` + h.path("list.json") + " document=1 item=1 kind=Service name=huge",
		"limitBytes=1572864",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not say %q:\n%s", want, logs)
		}
	}
}

// A file over the size limit is not read: a warning names it, and the
// objects it defined before stay.
func TestOversizedFileSkipped(t *testing.T) {
	h := newHarness(t)
	h.write("web.yaml", webService)
	h.start()
	evs := h.settle(func() {
		h.write("web.yaml", webService+strings.Repeat("# padding\n", maxFileBytes/10+1))
	})
	expectEvents(t, evs)
	want := `msg="Skipping a manifest file that is too large; keeping its last good objects" file=` + h.path("web.yaml")
	if logs := h.logs.String(); !strings.Contains(logs, want) || !strings.Contains(logs, "32 MiB") {
		t.Errorf("logs do not say %q with the limit:\n%s", want, logs)
	}
}

func TestPeekYAML(t *testing.T) {
	for _, tt := range []struct{ doc, kind, name string }{
		{"apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: prod\nspec: {}\n", "Service", "prod/web"},
		{"# c\nkind: \"List\" # comment\nitems: []\n", "List", ""},
		{"metadata:\n  labels:\n    name: not-this\n  name: 'quoted'\nkind: Node\n", "Node", "quoted"},
		{"kind: Service\nspec:\n  name: nope\n", "Service", ""},
	} {
		if kind, name := peekYAML([]byte(tt.doc)); kind != tt.kind || name != tt.name {
			t.Errorf("peekYAML(%q) = %q, %q; want %q, %q", tt.doc, kind, name, tt.kind, tt.name)
		}
	}
}
