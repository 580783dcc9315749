package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/rest"

	"github.com/weirproxy/weir/internal/syncbuf"
)

// waitTimeout bounds every poll of the tests.
const waitTimeout = 10 * time.Second

// fakeAPI is a tiny API server of our own: it lists one Service, no
// EndpointSlices and the node "n1" in JSON, turns streaming lists down
// (so the reflector lists), holds plain watches open without events, and
// can be told to fail every request with a status code.
type fakeAPI struct {
	srv  *httptest.Server
	fail atomic.Int32 // HTTP status every request fails with; 0 serves

	mu      sync.Mutex
	dropped chan struct{} // closed to end the watches open now
}

// newFakeAPI starts a fake API server, failing with status fail (0: none).
func newFakeAPI(t *testing.T, fail int) *fakeAPI {
	f := &fakeAPI{dropped: make(chan struct{})}
	f.fail.Store(int32(fail))
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// lists are the fake's objects, by path.
var lists = map[string]string{
	"/api/v1/services": `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[` +
		`{"metadata":{"name":"web","namespace":"default","resourceVersion":"5","uid":"0e3c5f2a",` +
		`"managedFields":[{"manager":"kubectl","operation":"Apply"}],"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"}},` +
		`"spec":{"clusterIP":"10.96.0.10","selector":{"app":"web"},"ports":[{"port":80,"targetPort":8080}]}}]}`,
	"/apis/discovery.k8s.io/v1/endpointslices": `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[]}`,
	"/api/v1/nodes": `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[` +
		`{"metadata":{"name":"n1","resourceVersion":"3"}}]}`,
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if code := int(f.fail.Load()); code != 0 {
		writeStatus(w, code, http.StatusText(code))
		return
	}
	list, ok := lists[r.URL.Path]
	q := r.URL.Query()
	switch {
	case !ok:
		writeStatus(w, http.StatusNotFound, "not found")
	case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
		writeStatus(w, http.StatusBadRequest, "streaming lists are not served here")
	case q.Get("watch") == "true":
		f.mu.Lock()
		dropped := f.dropped
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-dropped:
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(list))
	}
}

// dropWatches ends the watches open now, as an API server going away does.
func (f *fakeAPI) dropWatches() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.dropped)
	f.dropped = make(chan struct{})
}

// writeStatus answers with a metav1.Status of code, as the API server does.
func writeStatus(w http.ResponseWriter, code int, msg string) {
	reason := map[int]string{401: "Unauthorized", 403: "Forbidden", 503: "ServiceUnavailable", 400: "BadRequest", 404: "NotFound"}[code]
	body, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"message": msg, "reason": reason, "code": code})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentListener accepts connections and never answers; it returns its address.
func silentListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// closingListener accepts connections and closes them at once; it returns
// its address.
func closingListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// recorder is a source.Handler and source.Reporter that records its calls.
type recorder struct {
	mu    sync.Mutex
	calls []string
	svc   *corev1.Service // the last Service delivered
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) OnService(prev, cur *corev1.Service) {
	r.mu.Lock()
	r.svc = cur
	r.mu.Unlock()
	if cur != nil && prev == nil {
		r.add("add Service " + cur.Namespace + "/" + cur.Name)
	}
}
func (r *recorder) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) {}
func (r *recorder) OnNode(prev, cur *corev1.Node) {
	if cur != nil && prev == nil {
		r.add("add Node " + cur.Name)
	}
}
func (r *recorder) OnSynced()              { r.add("Synced") }
func (r *recorder) OnSourceDown(err error) { r.add("Down: " + err.Error()) }
func (r *recorder) OnSourceUp()            { r.add("Up") }

// snapshot returns the calls so far.
func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// running is a source started by a test.
type running struct {
	t      *testing.T
	rec    *recorder
	logs   *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

// quick are delays short enough for tests.
var quick = tuning{backoffInitial: 20 * time.Millisecond, backoffMax: 100 * time.Millisecond,
	firstReport: 200 * time.Millisecond, maxReport: 400 * time.Millisecond}

// start runs a source on cfg with quick delays.
func start(t *testing.T, cfg *rest.Config) *running {
	t.Helper()
	r := &running{t: t, rec: &recorder{}, logs: &syncbuf.Buffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := New(cfg, Options{NodeName: "n1", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	src.tune = quick
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	go func() { r.done <- src.Run(ctx, r.rec) }()
	t.Cleanup(func() {
		r.cancel()
		select {
		case _ = <-r.done: // TestRunReportsRefusedConnection checks Run's error after a cancel
		case <-time.After(waitTimeout):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// stop cancels the source and returns Run's error, failing the test unless
// Run returns within a second.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	began := time.Now()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		if took := time.Since(began); took > time.Second {
			r.t.Errorf("Run took %v to return after cancel, want at most a second", took)
		}
		return err
	case <-time.After(waitTimeout):
		r.t.Fatalf("Run did not return within %v of cancel", waitTimeout)
		return nil
	}
}

// waitLogs polls until the logs hold every one of want.
func (r *running) waitLogs(want ...string) {
	r.t.Helper()
	r.waitLogsWithin(waitTimeout, want...)
}

// waitLogsWithin polls for up to d until the logs hold every one of want.
func (r *running) waitLogsWithin(d time.Duration, want ...string) {
	r.t.Helper()
	pollWithin(r.t, d, fmt.Sprintf("logs with %q", want), func() bool {
		logs := r.logs.String()
		for _, w := range want {
			if !strings.Contains(logs, w) {
				return false
			}
		}
		return true
	}, func() string { return r.logs.String() })
}

// waitCall polls until the handler got a call starting with prefix.
func (r *running) waitCall(prefix string) {
	r.t.Helper()
	poll(r.t, "handler call "+prefix, func() bool {
		for _, c := range r.rec.snapshot() {
			if strings.HasPrefix(c, prefix) {
				return true
			}
		}
		return false
	}, func() string { return strings.Join(r.rec.snapshot(), "\n") + "\nlogs:\n" + r.logs.String() })
}

// poll checks cond every 10 ms, failing the test after waitTimeout with
// what show returns.
func poll(t *testing.T, what string, cond func() bool, show func() string) {
	t.Helper()
	pollWithin(t, waitTimeout, what, cond, show)
}

// pollWithin is poll with a deadline d from now.
func pollWithin(t *testing.T, d time.Duration, what string, cond func() bool, show func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s:\n%s", what, show())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// discard returns a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// config returns a JSON client configuration for server with the given limits.
func config(server string, l limits) *rest.Config {
	cfg := &rest.Config{Host: server}
	l.apply(cfg)
	return cfg
}
