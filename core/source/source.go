// Package source defines how the outside world reaches Weir: a Source turns
// Kubernetes objects into change notifications for a Handler. Sources keep,
// and deliver, records of the objects (records.go): what Weir reads of
// them, a fraction of their size. A Handler that is a RecordHandler gets
// the records themselves; any other gets objects made from them.
package source

import (
	"context"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Handler receives object changes; prev is nil for an addition, cur is nil for
// a deletion. Objects passed in must not be modified by either side.
//
// The objects a source delivers hold what its records keep (see Records):
// a Handler that keeps them should be a RecordHandler instead.
type Handler interface {
	OnService(prev, cur *corev1.Service)
	OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice)
	OnNode(prev, cur *corev1.Node)
	// OnSynced is called once, after the initial objects have all been delivered.
	OnSynced()
}

// RecordHandler is an optional capability of a Handler: it receives the
// records sources keep instead of objects. prev is nil for an addition, cur
// is nil for a deletion; records passed in must not be modified by either
// side.
type RecordHandler interface {
	OnServiceRecord(prev, cur *Service)
	OnEndpointSliceRecord(prev, cur *EndpointSlice)
	OnNodeRecord(prev, cur *Node)
	// OnSynced is called once, after the initial records have all been delivered.
	OnSynced()
}

// Reporter is an optional capability of a Handler: a source that can lose
// sight of its objects (a manifests folder removed, an API server that
// stopped answering) says so, and says when it sees them again. The objects
// last delivered stay in force meanwhile: a source never deletes objects
// because it cannot read them.
type Reporter interface {
	// OnSourceDown reports that the source cannot read its objects, and
	// why; it may be called again with a newer reason.
	OnSourceDown(err error)
	// OnSourceUp reports that the source reads its objects again (after
	// delivering the changes it found).
	OnSourceUp()
}

// ServiceCIDRHandler is an optional capability of a Handler: a source that
// watches the cluster's ServiceCIDR objects (networking.k8s.io/v1) hands
// it every range they hold, after each change, as kube-proxy's
// OnServiceCIDRsChanged gets them.
type ServiceCIDRHandler interface {
	// OnServiceCIDRs receives the spec.cidrs of every ServiceCIDR object,
	// sorted and without duplicates; the slice must not be modified.
	OnServiceCIDRs(cidrs []netip.Prefix)
}

// Source delivers object changes to a handler until its context ends.
type Source interface {
	// Run blocks, calling h for every change, and returns when ctx is done or
	// the source cannot continue. It delivers records when h is a
	// RecordHandler, objects made from them otherwise (see Records).
	Run(ctx context.Context, h Handler) error
}
