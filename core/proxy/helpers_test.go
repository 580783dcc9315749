package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/sdk/plan"
)

// wait bounds every wait for something another goroutine does.
const wait = 10 * time.Second

// syncCall is one call to the fake backend's Sync.
type syncCall struct {
	// full and changed are the request the proxy passed.
	isFull  bool
	changed []plan.Key
	// plan is a copy of the plan as it was during the call.
	plan *plan.Plan
	err  error
}

func (c syncCall) full() bool { return c.isFull }

// fakeBackend records every Sync and can be told to fail the next one.
type fakeBackend struct {
	mu       sync.Mutex
	calls    []syncCall
	failNext error
	cleanups int
	// each receives every call as it happens; buffered so Sync never blocks.
	each chan syncCall
}

var _ backends.Backend = (*fakeBackend)(nil)

func newFakeBackend() *fakeBackend {
	return &fakeBackend{each: make(chan syncCall, 100)}
}

func (b *fakeBackend) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := syncCall{isFull: req.Full, changed: slices.Clone(req.Changed), plan: p.Clone(), err: b.failNext}
	b.failNext = nil
	b.calls = append(b.calls, c)
	b.each <- c
	return c.err
}

func (b *fakeBackend) Cleanup(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups++
	return nil
}

// failNextSync makes the next Sync return err.
func (b *fakeBackend) failNextSync(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failNext = err
}

// count returns how many times Sync was called.
func (b *fakeBackend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// last returns the latest call; it fails the test if there was none.
func (b *fakeBackend) last(t *testing.T) syncCall {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.calls) == 0 {
		t.Fatal("backend: Sync was never called")
	}
	return b.calls[len(b.calls)-1]
}

// next waits for the next call, for code that syncs in the background.
func (b *fakeBackend) next(t *testing.T) syncCall {
	t.Helper()
	select {
	case c := <-b.each:
		return c
	case <-time.After(wait):
		t.Fatalf("backend: no Sync within %s", wait)
		return syncCall{}
	}
}

// logRecord is one captured log record with its attributes as text.
type logRecord struct {
	Level   slog.Level
	Message string
	Attrs   map[string]string
}

func (r logRecord) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.Level, r.Message)
	for _, k := range slices.Sorted(maps.Keys(r.Attrs)) {
		fmt.Fprintf(&b, " %s=%q", k, r.Attrs[k])
	}
	return b.String()
}

// logStore holds the records of a recordHandler and the handlers derived from it.
type logStore struct {
	mu      sync.Mutex
	records []logRecord
}

// recordHandler is a slog.Handler that keeps every record.
type recordHandler struct {
	store *logStore
	attrs []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Message: r.Message, Attrs: map[string]string{}}
	add := func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	h.store.records = append(h.store.records, rec)
	return nil
}

func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordHandler{store: h.store, attrs: append(slices.Clip(h.attrs), as...)}
}

// WithGroup is not needed by the code under test; groups are flattened away.
func (h *recordHandler) WithGroup(string) slog.Handler { return h }

// take returns the records logged since the last take and forgets them.
func (s *logStore) take() []logRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.records
	s.records = nil
	return out
}

// withPrefix returns the records whose message starts with prefix.
func withPrefix(records []logRecord, prefix string) []logRecord {
	var out []logRecord
	for _, r := range records {
		if strings.HasPrefix(r.Message, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// logged formats records for failure messages.
func logged(records []logRecord) string {
	var b strings.Builder
	for _, r := range records {
		b.WriteString("\n\t" + r.String())
	}
	return b.String()
}

// newProxy returns a proxy for node n1 with a recording backend and log.
func newProxy(t *testing.T) (*proxy.Proxy, *fakeBackend, *logStore) {
	t.Helper()
	be := newFakeBackend()
	logs := &logStore{}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, Log: slog.New(&recordHandler{store: logs})})
	return p, be, logs
}

// Kubernetes objects for the tests, all in namespace default.

const ns = "default"

func service(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: clusterIP,
			Ports:     ports,
		},
	}
}

func svcPort(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port}
}

func epPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: new(name), Protocol: new(corev1.ProtocolTCP), Port: new(port)}
}

// endpointSlice returns a slice of service svc with ready endpoints on node n1.
func endpointSlice(name, svc string, ports []discoveryv1.EndpointPort, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			NodeName:   new("n1"),
		})
	}
	return s
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

// withAddrs returns a copy of s, one resource version later, holding addrs.
func withAddrs(s *discoveryv1.EndpointSlice, addrs ...string) *discoveryv1.EndpointSlice {
	c := endpointSlice(s.Name, s.Labels[discoveryv1.LabelServiceName], s.Ports, addrs...)
	c.ResourceVersion = bump(s.ResourceVersion)
	return c
}

func bump(rv string) string {
	n, _ := strconv.Atoi(rv) // a resource version the test did not set is "": 0
	return strconv.Itoa(n + 1)
}

func node(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: "z1"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.168.0.10"},
		}},
	}
}

func key(name, port string) plan.Key {
	return plan.Key{Namespace: ns, Name: name, Port: port, Protocol: plan.TCP}
}

// sameKeys reports whether got and want hold the same keys, in any order.
func sameKeys(got, want []plan.Key) bool {
	got, want = slices.Clone(got), slices.Clone(want)
	slices.SortFunc(got, plan.Key.Compare)
	slices.SortFunc(want, plan.Key.Compare)
	return slices.Equal(got, want)
}

// fakeSource delivers initial objects, then OnSynced (unless noSync), then
// whatever the test sends on changes, until ctx is done or the test sends
// an error on fail.
type fakeSource struct {
	initial func(h source.Handler)
	noSync  bool
	changes chan func(h source.Handler)
	fail    chan error
	// started and stopped are closed when Run starts and returns.
	started, stopped chan struct{}
}

var _ source.Source = (*fakeSource)(nil)

func newFakeSource(initial func(h source.Handler)) *fakeSource {
	return &fakeSource{
		initial: initial,
		changes: make(chan func(source.Handler)),
		fail:    make(chan error),
		started: make(chan struct{}),
		stopped: make(chan struct{}),
	}
}

func (s *fakeSource) Run(ctx context.Context, h source.Handler) error {
	close(s.started)
	defer close(s.stopped)
	if s.initial != nil {
		s.initial(h)
	}
	if !s.noSync {
		h.OnSynced()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case f := <-s.changes:
			f(h)
		case err := <-s.fail:
			return err
		}
	}
}

// deliver hands f to the running source.
func (s *fakeSource) deliver(t *testing.T, f func(h source.Handler)) {
	t.Helper()
	select {
	case s.changes <- f:
	case <-s.stopped:
		t.Fatal("source: stopped before the change could be delivered")
	case <-time.After(wait):
		t.Fatalf("source: change not taken within %s", wait)
	}
}

// failWith makes the running source return err.
func (s *fakeSource) failWith(t *testing.T, err error) {
	t.Helper()
	select {
	case s.fail <- err:
	case <-s.stopped:
		t.Fatal("source: stopped before it could fail")
	case <-time.After(wait):
		t.Fatalf("source: failure not taken within %s", wait)
	}
}

// sourceFunc adapts a function to source.Source.
type sourceFunc func(ctx context.Context, h source.Handler) error

func (f sourceFunc) Run(ctx context.Context, h source.Handler) error { return f(ctx, h) }

// closed reports whether ch is closed, waiting up to wait for it.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(wait):
		return false
	}
}
