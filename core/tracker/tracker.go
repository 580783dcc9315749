// Package tracker merges record changes from a source into the set of
// services touched since the last sync, so that every later stage works in
// proportion to what changed, not to the size of the cluster.
package tracker

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/weirproxy/weir/core/source"
)

// ServiceState is one service with the EndpointSlices that belong to it.
// Either may be missing: a service without slices has no endpoints, slices
// without a service produce nothing.
type ServiceState struct {
	Service *source.Service
	Slices  []*source.EndpointSlice
}

// Snapshot is what a sync needs: the touched services' current state and the node.
type Snapshot struct {
	// Services maps namespace/name to the service's state, for every touched
	// service (all of them in a full snapshot). A deleted service maps to a
	// state with a nil Service.
	Services map[string]ServiceState
	Node     *source.Node
	// NodeChanged is true when the node changed since the last checkout.
	NodeChanged bool
	// ServiceCIDRs are the latest ranges of the cluster's ServiceCIDR
	// objects (see source.ServiceCIDRHandler).
	ServiceCIDRs []netip.Prefix
	// Full is true when Services holds every known service.
	Full bool
}

// Tracker implements source.RecordHandler and remembers the latest
// records. It is safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	services map[string]*source.Service
	// slices holds each service's slices, sorted by name: a service has
	// one or a few, and a map per service would cost more than they do.
	slices      map[string][]*source.EndpointSlice
	node        *source.Node
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
		services: map[string]*source.Service{},
		slices:   map[string][]*source.EndpointSlice{},
		touched:  map[string]struct{}{},
		notify:   notify,
	}
}

// sliceService returns the namespace/name of the service a slice belongs to,
// or "" when it carries no kubernetes.io/service-name label.
func sliceService(s *source.EndpointSlice) string {
	if s == nil || s.Service == "" {
		return ""
	}
	return s.Namespace + "/" + s.Service
}

// OnServiceRecord records a service addition, update or deletion.
func (t *Tracker) OnServiceRecord(prev, cur *source.Service) {
	if prev != nil && cur != nil && prev.Same(cur) {
		return
	}
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	key := obj.Key()
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

// OnEndpointSliceRecord records an EndpointSlice addition, update or deletion.
func (t *Tracker) OnEndpointSliceRecord(prev, cur *source.EndpointSlice) {
	if prev != nil && cur != nil && prev.Same(cur) {
		return
	}
	t.mu.Lock()
	if old := sliceService(prev); old != "" {
		t.removeSlice(old, prev.Name)
		t.touched[old] = struct{}{}
	}
	if svc := sliceService(cur); svc != "" {
		t.addSlice(svc, cur)
		t.touched[svc] = struct{}{}
	}
	t.mu.Unlock()
	t.changed()
}

// byName orders slices by name.
func byName(s *source.EndpointSlice, name string) int { return strings.Compare(s.Name, name) }

// addSlice adds s to svc's slices, or replaces the one of its name.
func (t *Tracker) addSlice(svc string, s *source.EndpointSlice) {
	list := t.slices[svc]
	i, found := slices.BinarySearchFunc(list, s.Name, byName)
	if found {
		list[i] = s
		return
	}
	t.slices[svc] = slices.Insert(list, i, s)
}

func (t *Tracker) removeSlice(svc, name string) {
	list := t.slices[svc]
	i, found := slices.BinarySearchFunc(list, name, byName)
	switch {
	case !found:
	case len(list) == 1:
		delete(t.slices, svc)
	default:
		t.slices[svc] = slices.Delete(list, i, i+1)
	}
}

// OnNodeRecord records a change of this node. A change of nothing Weir
// plans from (the deletion timestamp, read by the health check) is not one.
func (t *Tracker) OnNodeRecord(prev, cur *source.Node) {
	if prev != nil && cur != nil && samePlanned(prev, cur) {
		return
	}
	t.mu.Lock()
	t.node = cur
	t.nodeChanged = true
	t.mu.Unlock()
	t.changed()
}

// samePlanned reports whether two Nodes give the planner the same input.
func samePlanned(a, b *source.Node) bool {
	x, y := *a, *b
	x.Deleting, y.Deleting = false, false
	return x.Same(&y)
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
	// A new map after a large batch (the initial listing touches every
	// service): clear would keep its room for good.
	if len(t.touched) > smallBatch {
		t.touched = map[string]struct{}{}
	} else {
		clear(t.touched)
	}
	t.nodeChanged = false
	return snap
}

// smallBatch is the most touched services whose room Checkout keeps for
// the next batch.
const smallBatch = 256

func (t *Tracker) stateOf(name string) ServiceState {
	// A copy: the tracker's list changes with the next slice.
	return ServiceState{Service: t.services[name], Slices: slices.Clone(t.slices[name])}
}
