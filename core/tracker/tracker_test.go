package tracker_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
)

func service(ns, name, ip string) *source.Service {
	return &source.Service{
		Meta:       source.Meta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Type:       corev1.ServiceTypeClusterIP,
		ClusterIP:  ip,
		ClusterIPs: []string{ip},
		Ports:      []source.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
	}
}

func slice(ns, name, svc string, addrs ...string) *source.EndpointSlice {
	s := &source.EndpointSlice{
		Meta:        source.Meta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Service:     svc,
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []source.EndpointPort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: new(int32(8080))}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, source.Endpoint{Address: a, Ready: true, Serving: true})
	}
	return s
}

func node(name, zone string) *source.Node {
	return &source.Node{
		Meta:      source.Meta{Name: name, ResourceVersion: "1"},
		Zone:      zone,
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}},
	}
}

// bumped returns a copy of a record as a source would deliver it after a
// write that changed nothing the proxy reads.
func bumped[T any, P interface {
	*T
	SetResourceVersion(string)
}](obj P, rv string) P {
	c := P(new(*obj))
	c.SetResourceVersion(rv)
	return c
}

// counter is a notify func that counts its calls.
type counter struct{ n atomic.Int64 }

func (c *counter) notify()     { c.n.Add(1) }
func (c *counter) take() int64 { return c.n.Swap(0) }

func newTracker() (*tracker.Tracker, *counter) {
	c := &counter{}
	return tracker.New(c.notify), c
}

func keys(s tracker.Snapshot) []string { return slices.Sorted(maps.Keys(s.Services)) }

func sliceNames(st tracker.ServiceState) (n []string) {
	for _, s := range st.Slices {
		n = append(n, s.Name)
	}
	return n
}

// step is one event fed to the tracker.
type step func(*tracker.Tracker)

func onService(prev, cur *source.Service) step {
	return func(t *tracker.Tracker) { t.OnServiceRecord(prev, cur) }
}
func onSlice(prev, cur *source.EndpointSlice) step {
	return func(t *tracker.Tracker) { t.OnEndpointSliceRecord(prev, cur) }
}
func onNode(prev, cur *source.Node) step {
	return func(t *tracker.Tracker) { t.OnNodeRecord(prev, cur) }
}

// want describes one service in a snapshot.
type want struct {
	service *source.Service // nil: the state's Service must be nil
	slices  []string        // names, in order
}

func TestCheckout(t *testing.T) {
	web := service("shop", "web", "10.96.0.10")
	web2 := service("shop", "web", "10.96.0.11") // a real change: new cluster IP
	api := service("shop", "api", "10.96.0.20")
	webA := slice("shop", "web-a", "web", "10.244.0.1")
	webB := slice("shop", "web-b", "web", "10.244.0.2")
	webA2 := slice("shop", "web-a", "web", "10.244.0.1", "10.244.0.3")
	moved := slice("shop", "web-a", "api", "10.244.0.1") // web-a relabelled to api
	orphan := slice("shop", "gone-x", "gone", "10.244.9.9")
	unlabelled := slice("shop", "stray", "", "10.244.8.8")
	otherNS := service("other", "web", "10.96.1.10")

	tests := []struct {
		name    string
		history []step // fed, then checked out and discarded (full=false)
		steps   []step // fed after the first checkout
		full    bool
		notify  int64 // notify calls during steps
		want    map[string]want
	}{{
		name:   "service then slice",
		steps:  []step{onService(nil, web), onSlice(nil, webA)},
		notify: 2,
		want:   map[string]want{"shop/web": {web, []string{"web-a"}}},
	}, {
		name:   "slice before its service",
		steps:  []step{onSlice(nil, webB), onSlice(nil, webA), onService(nil, web)},
		notify: 3,
		want:   map[string]want{"shop/web": {web, []string{"web-a", "web-b"}}},
	}, {
		name:    "no-op service update touches nothing",
		history: []step{onService(nil, web), onSlice(nil, webA)},
		steps:   []step{onService(web, bumped(web, "2"))},
		notify:  0,
		want:    map[string]want{},
	}, {
		name:    "no-op slice update touches nothing",
		history: []step{onService(nil, web), onSlice(nil, webA)},
		steps:   []step{onSlice(webA, bumped(webA, "2"))},
		notify:  0,
		want:    map[string]want{},
	}, {
		name:    "no-op node update changes nothing",
		history: []step{onNode(nil, node("node-a", "z1"))},
		steps:   []step{onNode(node("node-a", "z1"), bumped(node("node-a", "z1"), "2"))},
		notify:  0,
		want:    map[string]want{},
	}, {
		name:    "service update",
		history: []step{onService(nil, web), onSlice(nil, webA), onService(nil, api)},
		steps:   []step{onService(web, web2)},
		notify:  1,
		want:    map[string]want{"shop/web": {web2, []string{"web-a"}}},
	}, {
		name:    "slice update",
		history: []step{onService(nil, web), onSlice(nil, webA), onSlice(nil, webB)},
		steps:   []step{onSlice(webA, webA2)},
		notify:  1,
		want:    map[string]want{"shop/web": {web, []string{"web-a", "web-b"}}},
	}, {
		name:    "slice moves to another service",
		history: []step{onService(nil, web), onService(nil, api), onSlice(nil, webA), onSlice(nil, webB)},
		steps:   []step{onSlice(webA, moved)},
		notify:  1,
		want: map[string]want{
			"shop/web": {web, []string{"web-b"}},
			"shop/api": {api, []string{"web-a"}},
		},
	}, {
		name:    "slice loses its label",
		history: []step{onService(nil, web), onSlice(nil, webA)},
		steps:   []step{onSlice(webA, slice("shop", "web-a", "", "10.244.0.1"))},
		notify:  1,
		want:    map[string]want{"shop/web": {web, nil}},
	}, {
		name:    "slice deleted",
		history: []step{onService(nil, web), onSlice(nil, webA), onSlice(nil, webB)},
		steps:   []step{onSlice(webB, nil)},
		notify:  1,
		want:    map[string]want{"shop/web": {web, []string{"web-a"}}},
	}, {
		name:    "service deleted",
		history: []step{onService(nil, web), onSlice(nil, webA)},
		steps:   []step{onService(web, nil)},
		notify:  1,
		want:    map[string]want{"shop/web": {nil, []string{"web-a"}}},
	}, {
		name:    "service and its slices deleted",
		history: []step{onService(nil, web), onSlice(nil, webA)},
		steps:   []step{onSlice(webA, nil), onService(web, nil)},
		notify:  2,
		want:    map[string]want{"shop/web": {nil, nil}},
	}, {
		name:   "slice without service-name label is ignored",
		steps:  []step{onSlice(nil, unlabelled)},
		notify: 1,
		want:   map[string]want{},
	}, {
		name:   "same name in two namespaces",
		steps:  []step{onService(nil, web), onService(nil, otherNS), onSlice(nil, webA)},
		notify: 3,
		want: map[string]want{
			"shop/web":  {web, []string{"web-a"}},
			"other/web": {otherNS, nil},
		},
	}, {
		name:    "pending set is cleared by checkout",
		history: []step{onService(nil, web), onSlice(nil, webA), onService(nil, api)},
		steps:   nil,
		want:    map[string]want{},
	}, {
		name:    "full checkout returns every service, including slice-only ones",
		history: []step{onService(nil, web), onSlice(nil, webA), onService(nil, api), onSlice(nil, orphan)},
		steps:   nil,
		full:    true,
		want: map[string]want{
			"shop/web":  {web, []string{"web-a"}},
			"shop/api":  {api, nil},
			"shop/gone": {nil, []string{"gone-x"}},
		},
	}, {
		name:    "full checkout includes touched deleted services",
		history: []step{onService(nil, web), onService(nil, api)},
		steps:   []step{onService(api, nil)},
		full:    true,
		notify:  1,
		want: map[string]want{
			"shop/web": {web, nil},
			"shop/api": {nil, nil},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, calls := newTracker()
			for _, s := range tt.history {
				s(tr)
			}
			tr.Checkout(false)
			calls.take()
			for _, s := range tt.steps {
				s(tr)
			}
			if got := calls.take(); got != tt.notify {
				t.Errorf("notify called %d times, want %d", got, tt.notify)
			}
			snap := tr.Checkout(tt.full)
			if snap.Full != tt.full {
				t.Errorf("Full = %v, want %v", snap.Full, tt.full)
			}
			if got, want := keys(snap), slices.Sorted(maps.Keys(tt.want)); !slices.Equal(got, want) {
				t.Fatalf("Checkout(%v) services %q, want %q", tt.full, got, want)
			}
			for name, w := range tt.want {
				st := snap.Services[name]
				if st.Service != w.service {
					t.Errorf("%s: Service = %v, want %v", name, describe(st.Service), describe(w.service))
				}
				if got := sliceNames(st); !slices.Equal(got, w.slices) {
					t.Errorf("%s: slices %q, want %q", name, got, w.slices)
				}
			}
			// A second checkout finds nothing pending.
			if again := tr.Checkout(false); len(again.Services) != 0 || again.NodeChanged {
				t.Errorf("second Checkout(false) = %v services (%q), NodeChanged %v; want nothing",
					len(again.Services), keys(again), again.NodeChanged)
			}
		})
	}
}

func describe(s *source.Service) string {
	if s == nil {
		return "nil"
	}
	return fmt.Sprintf("%s/%s %s", s.Namespace, s.Name, s.ClusterIP)
}

func TestSliceUpdateCarriesNewObject(t *testing.T) {
	tr, _ := newTracker()
	a := slice("shop", "web-a", "web", "10.244.0.1")
	a2 := slice("shop", "web-a", "web", "10.244.0.1", "10.244.0.2")
	tr.OnEndpointSliceRecord(nil, a)
	tr.OnEndpointSliceRecord(a, a2)
	st := tr.Checkout(false).Services["shop/web"]
	if len(st.Slices) != 1 || st.Slices[0] != a2 {
		t.Fatalf("slices = %v, want only the updated web-a", sliceNames(st))
	}
}

func TestNodeChanged(t *testing.T) {
	tr, calls := newTracker()
	if snap := tr.Checkout(false); snap.NodeChanged || snap.Node != nil {
		t.Fatalf("empty tracker: NodeChanged %v, Node %v", snap.NodeChanged, snap.Node)
	}
	n1 := node("node-a", "z1")
	tr.OnNodeRecord(nil, n1)
	if got := calls.take(); got != 1 {
		t.Errorf("notify called %d times for a new node, want 1", got)
	}
	snap := tr.Checkout(false)
	if !snap.NodeChanged || snap.Node != n1 {
		t.Errorf("after OnNode: NodeChanged %v, Node %p; want true, %p", snap.NodeChanged, snap.Node, n1)
	}
	if len(snap.Services) != 0 {
		t.Errorf("a node change touched services %q", keys(snap))
	}
	// Reported once: the next checkout still carries the node but not the change.
	snap = tr.Checkout(false)
	if snap.NodeChanged || snap.Node != n1 {
		t.Errorf("second checkout: NodeChanged %v, Node %p; want false, %p", snap.NodeChanged, snap.Node, n1)
	}

	// A Node's record holds neither its status heartbeats nor its
	// annotations (source's tests): those never reach the tracker.
	for _, tt := range []struct {
		name   string
		mutate func(*source.Node)
		change bool
	}{
		{"nothing but the resource version", func(*source.Node) {}, false},
		{"deletion timestamp (the health check's, not the plan's)", func(n *source.Node) { n.Deleting = true }, false},
		{"zone label", func(n *source.Node) { n.Zone = "z2" }, true},
		{"address", func(n *source.Node) {
			n.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.2"}}
		}, true},
		{"pod CIDRs", func(n *source.Node) { n.PodCIDRs = []string{"10.244.0.0/24"} }, true},
		{"autoscaler taint", func(n *source.Node) { n.ToBeDeleted = true }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, calls := newTracker()
			prev := node("node-a", "z1")
			tr.OnNodeRecord(nil, prev)
			tr.Checkout(false)
			calls.take()
			cur := bumped(prev, "2")
			tt.mutate(cur)
			tr.OnNodeRecord(prev, cur)
			snap := tr.Checkout(false)
			if snap.NodeChanged != tt.change {
				t.Errorf("NodeChanged = %v, want %v", snap.NodeChanged, tt.change)
			}
			var wantCalls int64
			if tt.change {
				wantCalls = 1
			}
			if got := calls.take(); got != wantCalls {
				t.Errorf("notify called %d times, want %d", got, wantCalls)
			}
		})
	}
}

func TestNodeDeleted(t *testing.T) {
	tr, _ := newTracker()
	n := node("node-a", "z1")
	tr.OnNodeRecord(nil, n)
	tr.Checkout(false)
	tr.OnNodeRecord(n, nil)
	if snap := tr.Checkout(false); !snap.NodeChanged || snap.Node != nil {
		t.Errorf("after delete: NodeChanged %v, Node %v; want true, nil", snap.NodeChanged, snap.Node)
	}
}

func TestSynced(t *testing.T) {
	tr, calls := newTracker()
	if tr.Synced() {
		t.Fatal("new tracker is synced")
	}
	tr.OnSynced()
	if !tr.Synced() {
		t.Fatal("not synced after OnSynced")
	}
	if got := calls.take(); got != 1 {
		t.Errorf("OnSynced notified %d times, want 1", got)
	}
}

func TestNilNotify(t *testing.T) {
	tr := tracker.New(nil)
	tr.OnServiceRecord(nil, service("a", "b", "10.96.0.1"))
	tr.OnEndpointSliceRecord(nil, slice("a", "b-1", "b", "10.244.0.1"))
	tr.OnNodeRecord(nil, node("n", "z"))
	tr.OnSynced()
	if got := keys(tr.Checkout(false)); !slices.Equal(got, []string{"a/b"}) {
		t.Errorf("services %q, want [a/b]", got)
	}
}

// TestNotifyWithoutLock checks that notify runs without the tracker's lock:
// a notify func that checks out (as a synchronous runner might) must not
// deadlock.
func TestNotifyWithoutLock(t *testing.T) {
	var tr *tracker.Tracker
	var seen []string
	tr = tracker.New(func() { seen = append(seen, keys(tr.Checkout(false))...) })
	tr.OnServiceRecord(nil, service("a", "b", "10.96.0.1"))
	if !slices.Equal(seen, []string{"a/b"}) {
		t.Errorf("notify saw %q, want [a/b]", seen)
	}
}

// TestConcurrent runs event handlers from several goroutines while another
// checks out; run it with -race. At the end every service must have been
// reported, and a full checkout must hold every service with all its slices.
func TestConcurrent(t *testing.T) {
	const workers, perWorker = 8, 50
	var notified atomic.Int64
	tr := tracker.New(func() { notified.Add(1) })

	stop := make(chan struct{})
	seen := map[string]bool{}
	checkouts := make(chan struct{})
	go func() {
		defer close(checkouts)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for name, st := range tr.Checkout(i%5 == 0).Services {
				seen[name] = true
				_ = sliceNames(st)
				if st.Service != nil {
					_ = st.Service.ClusterIP
				}
			}
			_ = tr.Synced()
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ns := fmt.Sprintf("ns-%d", w)
			for i := range perWorker {
				name := fmt.Sprintf("svc-%d", i)
				svc := service(ns, name, fmt.Sprintf("10.96.%d.%d", w, i))
				tr.OnServiceRecord(nil, svc)
				a := slice(ns, name+"-a", name, fmt.Sprintf("10.244.%d.%d", w, i))
				tr.OnEndpointSliceRecord(nil, a)
				tr.OnEndpointSliceRecord(a, slice(ns, name+"-a", name, fmt.Sprintf("10.244.%d.%d", w, i), "10.0.0.1"))
				tr.OnEndpointSliceRecord(nil, slice(ns, name+"-b", name, "10.0.0.2"))
				tr.OnServiceRecord(svc, bumped(svc, "2")) // no-op
				tr.OnNodeRecord(nil, node("node-a", fmt.Sprintf("z%d", i%3)))
			}
		})
	}
	wg.Wait()
	tr.OnSynced()
	close(stop)
	<-checkouts

	for name := range tr.Checkout(false).Services {
		seen[name] = true
	}
	if len(seen) != workers*perWorker {
		t.Errorf("checkouts reported %d services, want %d", len(seen), workers*perWorker)
	}
	full := tr.Checkout(true)
	if len(full.Services) != workers*perWorker {
		t.Fatalf("full checkout has %d services, want %d", len(full.Services), workers*perWorker)
	}
	for name, st := range full.Services {
		if st.Service == nil {
			t.Errorf("%s: nil Service", name)
		}
		if len(st.Slices) != 2 || len(st.Slices[0].Endpoints) != 2 {
			t.Errorf("%s: slices %q, want both with the update applied", name, sliceNames(st))
		}
	}
	// Five real changes per iteration (a new service, three slice events and
	// a node add; the no-op update notifies nothing), plus OnSynced.
	if n, want := notified.Load(), int64(workers*perWorker*5+1); n != want {
		t.Errorf("notify called %d times, want %d", n, want)
	}
	if !tr.Synced() {
		t.Error("not synced")
	}
}
