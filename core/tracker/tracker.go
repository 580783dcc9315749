// Package tracker merges object changes from a source into the set of
// services touched since the last sync, so that every later stage works in
// proportion to what changed, not to the size of the cluster.
package tracker

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// ServiceState is one service with the EndpointSlices that belong to it.
// Either may be missing: a service without slices has no endpoints, slices
// without a service produce nothing.
type ServiceState struct {
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
}

// Snapshot is what a sync needs: the touched services' current state and the node.
type Snapshot struct {
	// Services maps namespace/name to the service's state, for every touched
	// service (all of them in a full snapshot). A deleted service maps to a
	// state with a nil Service.
	Services map[string]ServiceState
	Node     *corev1.Node
	// NodeChanged is true when the node changed since the last checkout.
	NodeChanged bool
	// ServiceCIDRs are the latest ranges of the cluster's ServiceCIDR
	// objects (see source.ServiceCIDRHandler).
	ServiceCIDRs []netip.Prefix
	// Full is true when Services holds every known service.
	Full bool
}

// Tracker implements source.Handler and remembers the latest objects.
// It is safe for concurrent use.
type Tracker struct {
	mu          sync.Mutex
	services    map[string]*corev1.Service
	slices      map[string]map[string]*discoveryv1.EndpointSlice // service -> slice name -> slice
	node        *corev1.Node
	cidrs       []netip.Prefix
	touched     map[string]struct{}
	nodeChanged bool
	synced      bool
	notify      func()
}

// New returns an empty tracker; notify, if not nil, is called (without the
// lock held) after every change that needs a sync.
func New(notify func()) *Tracker {
	return &Tracker{
		services: map[string]*corev1.Service{},
		slices:   map[string]map[string]*discoveryv1.EndpointSlice{},
		touched:  map[string]struct{}{},
		notify:   notify,
	}
}

func nsName(namespace, name string) string { return namespace + "/" + name }

// sliceService returns the namespace/name of the service a slice belongs to,
// or "" when it carries no kubernetes.io/service-name label.
func sliceService(s *discoveryv1.EndpointSlice) string {
	if s == nil {
		return ""
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return ""
	}
	return nsName(s.Namespace, name)
}

// OnService records a service addition, update or deletion.
func (t *Tracker) OnService(prev, cur *corev1.Service) {
	if prev != nil && cur != nil && sameService(prev, cur) {
		return
	}
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	key := nsName(obj.Namespace, obj.Name)
	t.mu.Lock()
	if cur == nil {
		delete(t.services, key)
	} else {
		t.services[key] = cur
	}
	t.touched[key] = struct{}{}
	t.mu.Unlock()
	t.changed()
}

// OnEndpointSlice records an EndpointSlice addition, update or deletion.
func (t *Tracker) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) {
	if prev != nil && cur != nil && sameSlice(prev, cur) {
		return
	}
	t.mu.Lock()
	if old := sliceService(prev); old != "" {
		t.removeSlice(old, prev.Name)
		t.touched[old] = struct{}{}
	}
	if svc := sliceService(cur); svc != "" {
		if t.slices[svc] == nil {
			t.slices[svc] = map[string]*discoveryv1.EndpointSlice{}
		}
		t.slices[svc][cur.Name] = cur
		t.touched[svc] = struct{}{}
	}
	t.mu.Unlock()
	t.changed()
}

func (t *Tracker) removeSlice(svc, name string) {
	delete(t.slices[svc], name)
	if len(t.slices[svc]) == 0 {
		delete(t.slices, svc)
	}
}

// OnNode records a change of this node.
func (t *Tracker) OnNode(prev, cur *corev1.Node) {
	if prev != nil && cur != nil && equality.Semantic.DeepEqual(prev.Labels, cur.Labels) &&
		equality.Semantic.DeepEqual(prev.Spec, cur.Spec) && equality.Semantic.DeepEqual(prev.Status.Addresses, cur.Status.Addresses) {
		return
	}
	t.mu.Lock()
	t.node = cur
	t.nodeChanged = true
	t.mu.Unlock()
	t.changed()
}

// OnServiceCIDRs remembers the ranges of the cluster's ServiceCIDR
// objects.
func (t *Tracker) OnServiceCIDRs(cidrs []netip.Prefix) {
	t.mu.Lock()
	same := slices.Equal(t.cidrs, cidrs)
	t.cidrs = cidrs
	t.mu.Unlock()
	if !same {
		t.changed()
	}
}

// OnSynced marks the initial listing as complete.
func (t *Tracker) OnSynced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
	t.changed()
}

// Synced reports whether the source has delivered its initial objects.
func (t *Tracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced
}

func (t *Tracker) changed() {
	if t.notify != nil {
		t.notify()
	}
}

// Checkout returns the touched services and clears the pending set. With
// full set, every known service is returned instead.
func (t *Tracker) Checkout(full bool) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap := Snapshot{Services: map[string]ServiceState{}, Node: t.node, NodeChanged: t.nodeChanged,
		ServiceCIDRs: t.cidrs, Full: full}
	names := slices.Collect(maps.Keys(t.touched))
	if full {
		names = slices.AppendSeq(names, maps.Keys(t.services))
		names = slices.AppendSeq(names, maps.Keys(t.slices))
	}
	for _, name := range names {
		if _, done := snap.Services[name]; !done {
			snap.Services[name] = t.stateOf(name)
		}
	}
	clear(t.touched)
	t.nodeChanged = false
	return snap
}

func (t *Tracker) stateOf(name string) ServiceState {
	st := ServiceState{Service: t.services[name]}
	for _, s := range t.slices[name] {
		st.Slices = append(st.Slices, s)
	}
	slices.SortFunc(st.Slices, func(a, b *discoveryv1.EndpointSlice) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return st
}

func sameService(a, b *corev1.Service) bool {
	return equality.Semantic.DeepEqual(a.Spec, b.Spec) && equality.Semantic.DeepEqual(a.Labels, b.Labels) &&
		equality.Semantic.DeepEqual(a.Annotations, b.Annotations) && equality.Semantic.DeepEqual(a.Status, b.Status)
}

func sameSlice(a, b *discoveryv1.EndpointSlice) bool {
	return a.AddressType == b.AddressType && equality.Semantic.DeepEqual(a.Labels, b.Labels) &&
		equality.Semantic.DeepEqual(a.Endpoints, b.Endpoints) && equality.Semantic.DeepEqual(a.Ports, b.Ports)
}
