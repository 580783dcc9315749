// Package events posts Kubernetes Events on this node's Node object when an
// operator should look: a hook plugin quarantined or released, and syncs
// failing to commit several times in a row (and recovering). `kubectl
// describe node` then shows them beside the kubelet's.
package events

import (
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// FailuresBeforeEvent is how many commits in a row must fail before a
// SyncFailing event: one failure is retried at once and usually passes.
const FailuresBeforeEvent = 3

// The reasons of Weir's events.
const (
	ReasonPluginQuarantined = "PluginQuarantined"
	ReasonPluginReleased    = "PluginReleased"
	ReasonSyncFailing       = "SyncFailing"
	ReasonSyncRecovered     = "SyncRecovered"
)

// Reporter turns Weir's state changes into Events on one Node.
type Reporter struct {
	rec  record.EventRecorder
	node *corev1.ObjectReference

	mu sync.Mutex
	// failures counts the commits that failed since the last success.
	failures int
}

// NewReporter returns a reporter posting through rec about the Node named
// nodeName (whose UID, as kube-proxy does, is taken to be its name).
func NewReporter(rec record.EventRecorder, nodeName string) *Reporter {
	return &Reporter{rec: rec, node: &corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)}}
}

// Start returns a reporter posting to the API server of client as
// component "weir" on host nodeName, and the function that flushes and
// stops it.
func Start(client kubernetes.Interface, nodeName string) (*Reporter, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "weir", Host: nodeName})
	return NewReporter(rec, nodeName), b.Shutdown
}

// PluginQuarantined posts that a plugin entered quarantine (a warning) or
// left it.
func (r *Reporter) PluginQuarantined(plugin string, quarantined bool) {
	if quarantined {
		r.rec.Eventf(r.node, corev1.EventTypeWarning, ReasonPluginQuarantined,
			"Hook plugin %s is quarantined after repeated failures; its failure policy applies to every service until it recovers or is reloaded", plugin)
		return
	}
	r.rec.Eventf(r.node, corev1.EventTypeNormal, ReasonPluginReleased, "Hook plugin %s is out of quarantine", plugin)
}

// CommitFailed counts a failed commit; the FailuresBeforeEvent-th in a row
// posts a warning.
func (r *Reporter) CommitFailed() {
	r.mu.Lock()
	r.failures++
	n := r.failures
	r.mu.Unlock()
	if n == FailuresBeforeEvent {
		r.rec.Event(r.node, corev1.EventTypeWarning, ReasonSyncFailing,
			fmt.Sprintf("%d syncs in a row failed to commit rules; the kernel keeps the last good rules (see Weir's log)", n))
	}
}

// Committed ends a run of failures; one that had posted a warning posts
// the recovery.
func (r *Reporter) Committed() {
	r.mu.Lock()
	n := r.failures
	r.failures = 0
	r.mu.Unlock()
	if n >= FailuresBeforeEvent {
		r.rec.Eventf(r.node, corev1.EventTypeNormal, ReasonSyncRecovered, "Rules committed again after %d failed syncs", n)
	}
}
