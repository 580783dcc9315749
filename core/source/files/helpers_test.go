package files

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/internal/syncbuf"
)

const waitTimeout = 10 * time.Second

// event is one handler call seen by the recorder.
type event struct {
	kind      string // Node, Service, EndpointSlice, Synced, Down or Up
	prev, cur object
	err       error // the reason of a Down
}

// name returns namespace/name (or name) of the object the event is about.
func (e event) name() string {
	o := e.cur
	if o == nil {
		o = e.prev
	}
	if o == nil {
		return ""
	}
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// op returns add, update or delete.
func (e event) op() string {
	switch {
	case e.prev == nil:
		return "add"
	case e.cur == nil:
		return "delete"
	}
	return "update"
}

// String formats the event as "op Kind name".
func (e event) String() string {
	switch e.kind {
	case "Synced", "Down", "Up":
		return e.kind
	}
	return e.op() + " " + e.kind + " " + e.name()
}

// recorder is a source.RecordHandler that records every call. It is a
// source.Handler only to be passed to Run: the source delivers it records.
type recorder struct {
	source.Handler // never called
	mu             sync.Mutex
	events         []event
}

func (r *recorder) add(kind string, prev, cur object) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{kind: kind, prev: prev, cur: cur})
}

func (r *recorder) OnServiceRecord(prev, cur *source.Service) {
	r.add("Service", orNil(prev), orNil(cur))
}

func (r *recorder) OnEndpointSliceRecord(prev, cur *source.EndpointSlice) {
	r.add("EndpointSlice", orNil(prev), orNil(cur))
}

func (r *recorder) OnNodeRecord(prev, cur *source.Node) {
	r.add("Node", orNil(prev), orNil(cur))
}

func (r *recorder) OnSynced() { r.add("Synced", nil, nil) }

func (r *recorder) OnSourceDown(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{kind: "Down", err: err})
}

func (r *recorder) OnSourceUp() { r.add("Up", nil, nil) }

// orNil turns a typed nil pointer into a nil object.
func orNil[T any, P interface {
	*T
	object
}](p P) object {
	if p == nil {
		return nil
	}
	return p
}

// snapshot returns a copy of the events so far.
func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

// waitFor polls until cond holds for the events so far, failing after a deadline.
func (r *recorder) waitFor(t *testing.T, what string, cond func([]event) bool) []event {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		evs := r.snapshot()
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; events: %v", what, evs)
		}
		<-tick.C
	}
}

// harness runs a Source over a temporary directory.
type harness struct {
	t       *testing.T
	dir     string
	rec     *recorder
	logs    *syncbuf.Buffer
	cancel  context.CancelFunc
	done    chan error
	barrier int
	tune    func(*tuning) // shortens the source's delays, if set
}

// newHarness returns a harness over a fresh directory, not yet running.
func newHarness(t *testing.T) *harness {
	return &harness{t: t, dir: t.TempDir(), rec: &recorder{}, logs: &syncbuf.Buffer{}}
}

// start runs the source and waits for OnSynced.
func (h *harness) start() []event {
	h.t.Helper()
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	src := New(h.dir, log)
	if h.tune != nil {
		h.tune(&src.tune)
	}
	go func() { h.done <- src.Run(ctx, h.rec) }()
	h.t.Cleanup(h.stop)
	return h.rec.waitFor(h.t, "OnSynced", func(evs []event) bool {
		return len(evs) > 0 && evs[len(evs)-1].kind == "Synced"
	})
}

// stop cancels the source and waits for Run to return.
func (h *harness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run returned %v", err)
		}
		h.done <- err // let a second stop see it too
	case <-time.After(waitTimeout):
		h.t.Errorf("Run did not return after cancel")
	}
}

// path returns the absolute path of a file in the directory.
func (h *harness) path(rel string) string {
	return filepath.Join(h.dir, filepath.FromSlash(rel))
}

// write replaces a file atomically through a hidden temporary file, creating
// parent directories as needed.
func (h *harness) write(rel, content string) {
	h.t.Helper()
	path := h.path(rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		h.t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		h.t.Fatal(err)
	}
}

// remove deletes a file or directory tree.
func (h *harness) remove(rel string) {
	h.t.Helper()
	if err := os.RemoveAll(h.path(rel)); err != nil {
		h.t.Fatal(err)
	}
}

// settle runs change and returns exactly the events it caused. It brackets
// the change with a barrier Node: the barrier's deletion is delivered after
// every other change of its batch, and batches are delivered in order.
func (h *harness) settle(change func()) []event {
	h.t.Helper()
	h.barrier++
	name := fmt.Sprintf("zzzz-barrier-%d", h.barrier)
	file := name + ".yaml"
	h.write(file, "apiVersion: v1\nkind: Node\nmetadata:\n  name: "+name+"\n")
	h.rec.waitFor(h.t, "barrier add", hasEvent("add Node "+name))
	start := len(h.rec.snapshot())
	change()
	h.remove(file)
	evs := h.rec.waitFor(h.t, "barrier delete", hasEvent("delete Node "+name))
	var out []event
	for _, e := range evs[start:] {
		if e.name() != name {
			out = append(out, e)
		}
	}
	return out
}

// hasEvent returns a condition that holds once an event formats as want.
func hasEvent(want string) func([]event) bool {
	return func(evs []event) bool {
		for _, e := range evs {
			if e.String() == want {
				return true
			}
		}
		return false
	}
}

// eventStrings formats events for comparison.
func eventStrings(evs []event) string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = e.String()
	}
	return strings.Join(s, "\n")
}

// expectEvents fails unless evs format exactly as want.
func expectEvents(t *testing.T, evs []event, want ...string) {
	t.Helper()
	if got, w := eventStrings(evs), strings.Join(want, "\n"); got != w {
		t.Fatalf("events:\n%s\nwant:\n%s", got, w)
	}
}

// sameObjects reports whether two files' records are the same, resource
// versions included.
func sameObjects(a, b objects) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || x.GetResourceVersion() != y.GetResourceVersion() || !sameContent(x, y) {
			return false
		}
	}
	return true
}
