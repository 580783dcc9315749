package source

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scripted is a source that delivers a first batch of changes at once, a
// second batch when next is closed, and then returns err.
type scripted struct {
	next chan struct{}
	err  error
}

func (s scripted) Run(ctx context.Context, h Handler) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	h.OnService(nil, svc)
	h.(Reporter).OnSourceDown(errors.New("gone"))
	h.(Reporter).OnSourceUp()
	h.OnEndpointSlice(nil, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "a-1"}})
	h.OnSynced()
	<-s.next
	h.OnService(svc, nil)
	h.OnNode(nil, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	return s.err
}

// record is a handler and reporter that writes down what it got.
type record struct {
	mu  sync.Mutex
	got []string
}

func (r *record) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
}

func (r *record) OnService(prev, cur *corev1.Service) {
	if cur == nil {
		r.add("-svc " + prev.Name)
		return
	}
	r.add("+svc " + cur.Name)
}
func (r *record) OnEndpointSlice(_, cur *discoveryv1.EndpointSlice) { r.add("+slice " + cur.Name) }
func (r *record) OnNode(_, cur *corev1.Node)                        { r.add("+node " + cur.Name) }
func (r *record) OnSynced()                                         { r.add("synced") }
func (r *record) OnSourceDown(err error)                            { r.add("down " + err.Error()) }
func (r *record) OnSourceUp()                                       { r.add("up") }

// plain is a handler that is not a Reporter.
type plain struct{ r record }

func (p *plain) OnService(prev, cur *corev1.Service)                  { p.r.OnService(prev, cur) }
func (p *plain) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) { p.r.OnEndpointSlice(prev, cur) }
func (p *plain) OnNode(prev, cur *corev1.Node)                        { p.r.OnNode(prev, cur) }
func (p *plain) OnSynced()                                            { p.r.OnSynced() }

// TestPrefetch shows that a Prefetched source holds what its source
// delivered before Run and hands it over first, in order, reports
// included; then passes each later change on as it comes, and returns the
// source's error.
func TestPrefetch(t *testing.T) {
	next := make(chan struct{})
	boom := errors.New("boom")
	p := Prefetch(context.Background(), scripted{next: next, err: boom})
	// The source runs before Run: wait until it delivered its first batch.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.pending)
		p.mu.Unlock()
		if n == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source delivered %d changes before Run, want 5", n)
		}
		time.Sleep(time.Millisecond)
	}
	r := &record{}
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background(), r) }()
	close(next)
	if err := <-errc; !errors.Is(err, boom) {
		t.Errorf("Run returned %v, want the source's %v", err, boom)
	}
	want := []string{"+svc a", "down gone", "up", "+slice a-1", "synced", "-svc a", "+node n"}
	if !slices.Equal(r.got, want) {
		t.Errorf("delivered %q, want %q", r.got, want)
	}
}

// TestPrefetchToPlainHandler shows that reports are dropped for a handler
// that is not a Reporter, and that Run returns nil when its context ends
// before the source stops.
func TestPrefetchToPlainHandler(t *testing.T) {
	next := make(chan struct{})
	defer close(next)
	p := Prefetch(context.Background(), scripted{next: next})
	h := &plain{}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, h) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.r.mu.Lock()
		got := slices.Clone(h.r.got)
		h.r.mu.Unlock()
		if len(got) == 3 {
			if want := []string{"+svc a", "+slice a-1", "synced"}; !slices.Equal(got, want) {
				t.Errorf("delivered %q, want %q", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handler got %q, want 3 changes", got)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run returned %v after its context ended, want nil", err)
	}
}

// recordsSource delivers one record of each kind, then its end.
type recordsSource struct{}

var (
	testService = &Service{Meta: Meta{Namespace: "ns", Name: "a", ResourceVersion: "1"}, ClusterIP: "10.96.0.1"}
	testSlice   = &EndpointSlice{Meta: Meta{Namespace: "ns", Name: "a-1", ResourceVersion: "1"}, Service: "a",
		Endpoints: []Endpoint{{Address: "10.244.0.1", Ready: true, Serving: true}}}
	testNode = &Node{Meta: Meta{Name: "n", ResourceVersion: "1"}, Zone: "z"}
)

func (recordsSource) Run(_ context.Context, h Handler) error {
	r := Records(h)
	r.OnServiceRecord(nil, testService)
	r.OnEndpointSliceRecord(nil, testSlice)
	r.OnNodeRecord(nil, testNode)
	r.OnSynced()
	return nil
}

// takesRecords is a handler that takes records.
type takesRecords struct {
	plain
	services []*Service
	slices   []*EndpointSlice
	nodes    []*Node
}

func (t *takesRecords) OnServiceRecord(_, cur *Service)             { t.services = append(t.services, cur) }
func (t *takesRecords) OnEndpointSliceRecord(_, cur *EndpointSlice) { t.slices = append(t.slices, cur) }
func (t *takesRecords) OnNodeRecord(_, cur *Node)                   { t.nodes = append(t.nodes, cur) }

// TestPrefetchRecords: through a Prefetched source, a handler that takes
// records gets the very records the source delivered, and any other
// handler objects made from them.
func TestPrefetchRecords(t *testing.T) {
	rec := &takesRecords{}
	if err := Prefetch(context.Background(), recordsSource{}).Run(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.services, []*Service{testService}) || !slices.Equal(rec.slices, []*EndpointSlice{testSlice}) ||
		!slices.Equal(rec.nodes, []*Node{testNode}) || !slices.Equal(rec.r.got, []string{"synced"}) {
		t.Errorf("a record handler got %v %v %v %q", rec.services, rec.slices, rec.nodes, rec.r.got)
	}
	p := &plain{}
	if err := Prefetch(context.Background(), recordsSource{}).Run(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if want := []string{"+svc a", "+slice a-1", "+node n", "synced"}; !slices.Equal(p.r.got, want) {
		t.Errorf("a plain handler got %q, want %q", p.r.got, want)
	}
}

// untilDone is a source that delivers nothing and returns nil once its
// context ends.
type untilDone struct{}

func (untilDone) Run(ctx context.Context, _ Handler) error {
	<-ctx.Done()
	return nil
}

// TestPrefetchRunEndsAfterItsContext shows that when the source stopped
// because Prefetch's context ended, Run returns only once its own context
// has ended too: a context derived from Prefetch's ends a moment after it,
// and Run's caller must not take the stop for a source that quit early.
func TestPrefetchRunEndsAfterItsContext(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background())
	p := Prefetch(parent, untilDone{})
	own, cancelOwn := context.WithCancel(context.Background())
	defer cancelOwn()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(own, &record{}) }()
	cancelParent()
	<-p.done // the source has stopped; Run must keep waiting
	select {
	case err := <-errc:
		t.Fatalf("Run returned %v before its own context ended", err)
	case <-time.After(100 * time.Millisecond): // a wrong Run returns within microseconds
	}
	cancelOwn()
	if err := <-errc; err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
}
