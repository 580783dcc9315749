package compare

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/test/netns"
)

// How the kernel is checked. Every timed measure ends when a connection
// from the client namespace to a probe service's cluster IP is answered by
// the pod the API says is its endpoint: the rules are in the kernel, not
// only in a proxy's log. Each probe service has one endpoint, moved along
// a cycle of probePodCount pods: its state k (the k-th write) puts the
// endpoint on pod k mod probePodCount. A write is committed once the
// kernel shows state k or a later one (a proxy that syncs two writes at
// once programs only the later: the earlier is superseded, and counts as
// committed with it, as in Kubernetes' network programming latency).
//
// At most maxPending writes of one service are measured at once. While
// write k is measured, the kernel shows a state in [k-maxPending,
// k+maxPending-1]: the writes before the oldest one measured were seen
// committed, and at most maxPending-1 came after k. That window holds
// probePodCount = 2*maxPending states, so the answering pod names the
// state without ambiguity.

// probePort is the probe services' port; the pods answer on podPort.
const (
	probePort = 80
	podPort   = 8080
)

// The probe pods' cycle and the writes of one service measured at once.
const (
	maxPending    = 4
	probePodCount = 2 * maxPending
)

// probePodName and probePodIP are probe pod j's name and address; every
// fresh topology gets the same.
func probePodName(j int) string { return fmt.Sprintf("p%d", j) }

func probePodIP(j int) netip.Addr { return offset(netns.DefaultPodCIDR.Addr(), 1+j) }

// probeService is one service whose single endpoint is a probe pod.
type probeService struct {
	name string
	vip  netip.Addr

	// write orders its writes; mu guards state, the last one written,
	// and pending, the writes being measured.
	write   sync.Mutex
	mu      sync.Mutex
	state   int
	pending int
}

// committed reports whether pod, answering for the service while write k
// is measured, shows state k or a later one.
func committed(pod string, k int) bool {
	var j int
	if _, err := fmt.Sscanf(pod, "p%d", &j); err != nil || j < 0 || j >= probePodCount {
		return false
	}
	low := k - maxPending
	s := low + ((j-low)%probePodCount+probePodCount)%probePodCount
	return s >= k
}

// probeSet holds the probe services.
type probeSet struct {
	w    *writer
	svcs []*probeService

	mu   sync.Mutex
	next int
}

// newProbeSet creates n probe services, each with its endpoint on the
// first pod, and reads back their cluster IPs.
func newProbeSet(ctx context.Context, w *writer, n int) (*probeSet, error) {
	ps := &probeSet{w: w, svcs: make([]*probeService, n)}
	err := w.each(ctx, n, func(ctx context.Context, i int) error {
		svc := probeServiceObject(fmt.Sprintf("probe-%d", i))
		created, err := w.client.CoreV1().Services(probeNamespace).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create probe service: %w", err)
		}
		vip, err := netip.ParseAddr(created.Spec.ClusterIP)
		if err != nil {
			return fmt.Errorf("probe service %s: cluster IP %q: %w", svc.Name, created.Spec.ClusterIP, err)
		}
		ps.svcs[i] = &probeService{name: svc.Name, vip: vip}
		return w.putSlice(ctx, probeSlice(svc.Name, 0), true)
	})
	return ps, err
}

// probeServiceObject is a plain ClusterIP service, port 80 to the pods' 8080.
func probeServiceObject(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: probeNamespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: probePort, TargetPort: intstr.FromInt32(podPort), Protocol: corev1.ProtocolTCP,
		}}},
	}
}

// probeSlice is the EndpointSlice of probe service name at state k: its
// one endpoint on probe pod k mod probePodCount.
func probeSlice(name string, k int) *discoveryv1.EndpointSlice {
	ready, node := true, nodeName
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: probeNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{slicePort(podPort)},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{probePodIP(k % probePodCount).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		}},
	}
}

// first is the probe service the first sync is checked with.
func (ps *probeSet) first() *probeService { return ps.svcs[0] }

// acquire returns the next probe service with fewer than maxPending
// writes measured, counting one more, or nil when there is none.
func (ps *probeSet) acquire() *probeService {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for range ps.svcs {
		p := ps.svcs[ps.next]
		ps.next = (ps.next + 1) % len(ps.svcs)
		p.mu.Lock()
		ok := p.pending < maxPending
		if ok {
			p.pending++
		}
		p.mu.Unlock()
		if ok {
			return p
		}
	}
	return nil
}

// release ends the measuring of one of p's writes.
func (ps *probeSet) release(p *probeService) {
	p.mu.Lock()
	p.pending--
	p.mu.Unlock()
}

// current is p's last state written.
func (p *probeService) current() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// flip writes p's next state through the API and returns it with the
// time the write was sent.
func (ps *probeSet) flip(ctx context.Context, p *probeService) (int, time.Time, error) {
	p.write.Lock()
	defer p.write.Unlock()
	k := p.current() + 1
	sent := time.Now()
	if err := ps.w.putSlice(ctx, probeSlice(p.name, k), false); err != nil {
		return k, sent, err
	}
	p.mu.Lock()
	p.state = k
	p.mu.Unlock()
	return k, sent, nil
}

// Probing: a connection is started every gap, an eighth of the time
// waited so far between minProbeGap and maxProbeGap, without waiting for
// the ones still open (a SYN that a half-built table drops would otherwise
// hold the probe for its timeout). A change counts as committed when the
// first connection showing it completes: an upper bound, late by at most
// one gap and one connection's round trip. All the probes of a run share
// a budget of probeRate connections a second (with a burst of
// probeBurst), so that a slow proxy with many changes pending is not
// also swamped by probes: with few pending, the gaps decide.
const (
	minProbeGap = 2 * time.Millisecond
	maxProbeGap = 50 * time.Millisecond
	dialTimeout = 2 * time.Second
	maxInFlight = 32
	probeRate   = 300
	probeBurst  = 30
)

// dialBudget hands out probeRate connections a second.
type dialBudget struct {
	tokens chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

func newDialBudget() *dialBudget {
	b := &dialBudget{tokens: make(chan struct{}, probeBurst), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		tick := time.NewTicker(time.Second / probeRate)
		defer tick.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-tick.C:
			}
			select {
			case b.tokens <- struct{}{}:
			default: // full: the burst is saved up
			}
		}
	}()
	return b
}

// take waits for a connection's turn.
func (b *dialBudget) take(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-b.tokens:
		return nil
	}
}

// close stops the budget's ticker.
func (b *dialBudget) close() {
	close(b.stop)
	<-b.done
}

// answer is one probe connection's outcome.
type answer struct {
	done time.Time
	pod  string
	err  error
}

// awaitAnswer probes p's cluster IP from the client namespace until the kernel shows
// state k or a later one, and returns when that connection completed.
// Before the rules exist a connection is refused at once (by the sink,
// see newNode); an answer showing an earlier state means the old rules
// are still there.
func (n *node) awaitAnswer(ctx context.Context, p *probeService, k int, since time.Time) (time.Time, error) {
	addr := netip.AddrPortFrom(p.vip, probePort)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	answers := make(chan answer, maxInFlight) // never blocks: at most maxInFlight are open
	inFlight := 0
	var last error
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, errors.Join(context.Cause(ctx),
				fmt.Errorf("waiting for %s to answer at %s (%s, state %d): %w", probePodName(k%probePodCount), addr, p.name, k, orNone(last, "no answer yet")))
		case a := <-answers:
			inFlight--
			if a.err == nil && committed(a.pod, k) {
				return a.done, nil
			}
			last = a.err
			if a.err == nil {
				last = fmt.Errorf("%s answered: an earlier state", a.pod)
			}
			continue
		case <-next.C:
		}
		if inFlight < maxInFlight {
			if err := n.budget.take(ctx); err != nil {
				continue // ctx ended: reported above
			}
			inFlight++
			go func() {
				dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
				defer dcancel()
				a, err := n.topo.Client.DialTCP(dctx, addr)
				answers <- answer{done: time.Now(), pod: a.Pod, err: err}
			}()
		}
		next.Reset(min(max(time.Since(since)/8, minProbeGap), maxProbeGap))
	}
}
