package proxy

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
)

var (
	_ source.Handler            = (*inbound)(nil)
	_ source.RecordHandler      = (*inbound)(nil)
	_ source.Reporter           = (*inbound)(nil)
	_ source.ServiceCIDRHandler = (*inbound)(nil)
)

// inbound sits between the source and the tracker. It counts the Service
// and EndpointSlice changes for the metrics as kube-proxy's change trackers
// do (every event the source delivers, an informer's resync of an
// unchanged object too; of EndpointSlices, those of an IP address type
// that name their service), keeps the EndpointSlices' last-change-trigger-
// times until the sync that commits them, and follows whether this Node is
// being deleted, for /healthz. It takes records, as the sources keep them,
// and objects, made into records.
type inbound struct {
	p *Proxy
	// compact makes records of the objects handed in as objects.
	compact *source.Compactor
	// start is when the proxy was created: trigger times from before it
	// belong to changes some earlier proxy programmed.
	start time.Time

	// mu is held while a change is recorded and handed to the tracker, and
	// while a sync checks both out, so that a trigger time is taken by the
	// sync that takes its change.
	mu sync.Mutex
	// services holds the namespace/name of the services with Service
	// changes not yet synced; sliceChanges counts the EndpointSlice changes
	// not yet synced (a new resource version each).
	services     map[string]struct{}
	sliceChanges int
	// triggers holds, per service, the trigger times of the slice changes
	// not yet synced; carried those of a failed sync, which the next
	// successful (full) sync commits.
	triggers map[string][]trigger
	carried  []trigger
	// sourceDown is set between OnSourceDown and OnSourceUp.
	sourceDown bool
	// ownNode is set once the Node named NodeName arrived.
	ownNode bool
}

func newInbound(p *Proxy, start time.Time) *inbound {
	return &inbound{
		p: p, start: start, compact: source.NewCompactor(),
		services: map[string]struct{}{},
		triggers: map[string][]trigger{},
	}
}

// trigger is the last-change-trigger-time of an EndpointSlice change and
// the IP family of the slice.
type trigger struct {
	at     time.Time
	family string
}

// sameVersion reports whether an update carries the object it replaces:
// an informer's periodic resync delivers such updates, which change nothing.
func sameVersion(prev, cur string) bool { return prev != "" && prev == cur }

// OnService makes records of a Service change and handles them.
func (in *inbound) OnService(prev, cur *corev1.Service) {
	in.OnServiceRecord(in.compact.Service(prev), in.compact.Service(cur))
}

// OnEndpointSlice makes records of an EndpointSlice change and handles them.
func (in *inbound) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) {
	in.OnEndpointSliceRecord(in.compact.EndpointSlice(prev), in.compact.EndpointSlice(cur))
}

// OnNode makes records of a Node change and handles them.
func (in *inbound) OnNode(prev, cur *corev1.Node) {
	in.OnNodeRecord(in.compact.Node(prev), in.compact.Node(cur))
}

// OnServiceRecord counts a Service change and hands it to the tracker.
func (in *inbound) OnServiceRecord(prev, cur *source.Service) {
	prev, cur = seenService(prev), seenService(cur)
	if prev == nil && cur == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	obj := cur
	if obj == nil {
		obj = prev
	}
	if m := in.p.opts.Metrics; m != nil && obj != nil {
		m.ServiceChanged()
	}
	if obj != nil && (prev == nil || cur == nil || !sameVersion(prev.ResourceVersion, cur.ResourceVersion)) {
		in.services[obj.Key()] = struct{}{}
		in.pending()
	}
	in.p.tracker.OnServiceRecord(prev, cur)
}

// OnEndpointSliceRecord counts an EndpointSlice change, keeps its trigger
// time and hands it to the tracker.
func (in *inbound) OnEndpointSliceRecord(prev, cur *source.EndpointSlice) {
	prev, cur = seenSlice(prev), seenSlice(cur)
	if prev == nil && cur == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	s := cur
	if s == nil {
		s = prev
	}
	if sliceFamily(s) != "" && sliceService(s) != "" {
		if m := in.p.opts.Metrics; m != nil {
			m.EndpointsChanged()
		}
		if prev == nil || cur == nil || !sameVersion(prev.ResourceVersion, cur.ResourceVersion) {
			in.sliceChanges++
			in.keepTrigger(prev, cur)
			in.pending()
		}
	}
	in.p.tracker.OnEndpointSliceRecord(prev, cur)
}

// seenService returns svc, or nil when kube-proxy's Service informer
// leaves it out (cmd/kube-proxy/app/server.go): a Service labelled
// service.kubernetes.io/service-proxy-name, another proxy's, or a headless
// one. A label added or removed then reads as a deletion or a creation, as
// it does through the informer. The kubernetes source leaves them out
// already; the files source hands over every object.
func seenService(svc *source.Service) *source.Service {
	if svc == nil || svc.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	if _, other := svc.Labels[planner.LabelServiceProxyName]; other {
		return nil
	}
	return svc
}

// seenSlice returns s, or nil when kube-proxy's EndpointSlice informer
// leaves it out: a slice labelled service.kubernetes.io/headless.
func seenSlice(s *source.EndpointSlice) *source.EndpointSlice {
	if s == nil || s.Headless {
		return nil
	}
	return s
}

// keepTrigger remembers cur's last-change-trigger-time. A deleted slice
// carries the time of its last update, not of its deletion, so the times
// of its service and family are dropped instead, as kube-proxy's tracker
// of that family does.
func (in *inbound) keepTrigger(prev, cur *source.EndpointSlice) {
	if cur == nil {
		name, family := sliceService(prev), sliceFamily(prev)
		in.triggers[name] = slices.DeleteFunc(in.triggers[name], func(t trigger) bool { return t.family == family })
		if len(in.triggers[name]) == 0 {
			delete(in.triggers, name)
		}
		return
	}
	name := sliceService(cur)
	raw := cur.TriggerTime
	if name == "" || raw == "" {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil || !t.After(in.start) {
		return
	}
	in.triggers[name] = append(in.triggers[name], trigger{at: t, family: sliceFamily(cur)})
}

// sliceFamily is the IP family of a slice's addresses, or "" for nil and
// for address types kube-proxy ignores (FQDN).
func sliceFamily(s *source.EndpointSlice) string {
	switch {
	case s == nil:
		return ""
	case s.AddressType == discoveryv1.AddressTypeIPv4:
		return backends.IPv4
	case s.AddressType == discoveryv1.AddressTypeIPv6:
		return backends.IPv6
	}
	return ""
}

// sliceService is the namespace/name of the service a slice belongs to, or
// "" for nil or a slice without the kubernetes.io/service-name label.
func sliceService(s *source.EndpointSlice) string {
	if s == nil || s.Service == "" {
		return ""
	}
	return s.Namespace + "/" + s.Service
}

// OnNodeRecord follows this Node's eligibility and hands the change to the
// tracker. A deleted Node keeps the eligibility of its last state.
func (in *inbound) OnNodeRecord(prev, cur *source.Node) {
	node := cur
	if node == nil {
		node = prev
	}
	if node == nil {
		return
	}
	if name := in.p.opts.NodeName; name != "" && node.Name != name {
		// A files source's folder may describe several Nodes: only this
		// one gives the zone, podCIDRs and addresses.
		in.p.log.Debug("Ignoring another Node", "node", node.Name, "nodeName", name)
		return
	}
	if h := in.p.opts.Health; h != nil {
		h.SetNodeEligible(nodeEligible(node))
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.ownNode = cur != nil
	in.p.tracker.OnNodeRecord(prev, cur)
}

// nodeEligible reports whether node should receive traffic: not while it
// is being deleted or the cluster autoscaler is about to remove it (its
// ToBeDeletedByClusterAutoscaler taint); like kube-proxy, /healthz then
// fails so that load balancers drain the Node first.
func nodeEligible(node *source.Node) bool {
	return !node.Deleting && !node.ToBeDeleted
}

// OnSourceDown reports, once per outage, that the source cannot read its
// objects; the rules stay as they are, and /healthz fails meanwhile.
func (in *inbound) OnSourceDown(err error) {
	in.mu.Lock()
	first := !in.sourceDown
	in.sourceDown = true
	in.mu.Unlock()
	if first {
		in.p.log.Warn("The source cannot read its objects; keeping the current rules until it can", "error", err)
	}
	if h := in.p.opts.Health; h != nil {
		h.SetSourceAvailable(false)
	}
}

// OnSourceUp reports that the source reads its objects again.
func (in *inbound) OnSourceUp() {
	in.mu.Lock()
	was := in.sourceDown
	in.sourceDown = false
	in.mu.Unlock()
	if was {
		in.p.log.Info("The source reads its objects again")
	}
	if h := in.p.opts.Health; h != nil {
		h.SetSourceAvailable(true)
	}
}

// OnServiceCIDRs hands the ranges of the cluster's ServiceCIDR objects to
// the tracker.
func (in *inbound) OnServiceCIDRs(cidrs []netip.Prefix) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.p.tracker.OnServiceCIDRs(cidrs)
}

// OnSynced marks the initial listing complete, warning when it held no
// Node named NodeName.
func (in *inbound) OnSynced() {
	in.mu.Lock()
	own := in.ownNode
	in.mu.Unlock()
	if name := in.p.opts.NodeName; name != "" && !own {
		in.p.log.Warn("The source has no Node named nodeName; Weir runs without the node's zone, podCIDRs and addresses (topology, detectLocalMode NodeCIDR and nodePortAddresses primary, the default in mode nftables, need them)",
			"nodeName", name)
	}
	in.p.tracker.OnSynced()
}

// smallBatch is the most pending services whose room checkout keeps for
// the next batch.
const smallBatch = 256

// pending publishes how many changes wait; mu is held.
func (in *inbound) pending() {
	if m := in.p.opts.Metrics; m != nil {
		m.Pending(len(in.services), in.sliceChanges)
	}
}

// checkout takes the tracker's pending changes and the trigger times of the
// slice changes among them.
func (in *inbound) checkout() (tracker.Snapshot, []trigger) {
	in.mu.Lock()
	defer in.mu.Unlock()
	snap := in.p.tracker.Checkout(false)
	times := in.carried
	in.carried = nil
	for _, ts := range in.triggers {
		times = append(times, ts...)
	}
	// New maps after a large batch (the initial listing): clear would keep
	// their room for good.
	if len(in.services) > smallBatch || len(in.triggers) > smallBatch {
		in.services, in.triggers = map[string]struct{}{}, map[string][]trigger{}
	} else {
		clear(in.triggers)
		clear(in.services)
	}
	in.sliceChanges = 0
	in.pending()
	return snap, times
}

// restore keeps the trigger times of a failed sync for the next one.
func (in *inbound) restore(times []trigger) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.carried = append(in.carried, times...)
}
