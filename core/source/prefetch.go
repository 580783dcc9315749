package source

import (
	"context"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Prefetched is a source started before anything handles its changes: a
// daemon lists its objects while it loads its backend and plugins, instead
// of after. It holds what the source delivers until Run gives it a handler.
type Prefetched struct {
	mu      sync.Mutex
	pending []func(*target) // in the order the source delivered them
	to      *target         // nil until Run
	done    chan struct{}   // closed when the source's Run returned
	err     error           // what it returned
	ctx     context.Context // the source's
}

// target is the handler Run was given, and what records reach it through.
type target struct {
	h       Handler
	records RecordHandler
}

var (
	_ Handler            = (*Prefetched)(nil)
	_ RecordHandler      = (*Prefetched)(nil)
	_ Reporter           = (*Prefetched)(nil)
	_ ServiceCIDRHandler = (*Prefetched)(nil)
)

// Prefetch starts src at once, running until ctx ends, and returns it as a
// Prefetched source.
func Prefetch(ctx context.Context, src Source) *Prefetched {
	p := &Prefetched{done: make(chan struct{}), ctx: ctx}
	go func() {
		p.err = src.Run(ctx, p)
		close(p.done)
	}()
	return p
}

// Run delivers to h, in order, every change the source delivered so far,
// then each next one as it comes; it returns what the source's Run
// returned, or nil when ctx ends first. It may be called once. ctx should
// end when Prefetch's context does (be derived from it): when the source
// stopped because that context ended, Run returns once ctx has ended too,
// so that its caller sees its own context done (a derived context ends a
// moment after its parent).
func (p *Prefetched) Run(ctx context.Context, h Handler) error {
	to := &target{h: h, records: Records(h)}
	p.mu.Lock()
	for _, deliver := range p.pending {
		deliver(to)
	}
	p.pending, p.to = nil, to
	p.mu.Unlock()
	select {
	case <-p.done:
		if p.err == nil && p.ctx.Err() != nil {
			waitDone(ctx, stopGrace)
		}
		return p.err
	case <-ctx.Done():
		return nil
	}
}

// stopGrace bounds how long Run waits for its context to end after the
// source stopped because Prefetch's context ended: only a context not
// derived from that one takes longer.
const stopGrace = time.Second

// waitDone returns when ctx ends or after d.
func waitDone(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// deliver hands one change to the handler, or holds it until there is one.
func (p *Prefetched) deliver(fn func(*target)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.to == nil {
		p.pending = append(p.pending, fn)
		return
	}
	fn(p.to)
}

// OnServiceRecord passes a Service change on.
func (p *Prefetched) OnServiceRecord(prev, cur *Service) {
	p.deliver(func(t *target) { t.records.OnServiceRecord(prev, cur) })
}

// OnEndpointSliceRecord passes an EndpointSlice change on.
func (p *Prefetched) OnEndpointSliceRecord(prev, cur *EndpointSlice) {
	p.deliver(func(t *target) { t.records.OnEndpointSliceRecord(prev, cur) })
}

// OnNodeRecord passes a Node change on.
func (p *Prefetched) OnNodeRecord(prev, cur *Node) {
	p.deliver(func(t *target) { t.records.OnNodeRecord(prev, cur) })
}

// OnService passes a Service change on.
func (p *Prefetched) OnService(prev, cur *corev1.Service) {
	p.deliver(func(t *target) { t.h.OnService(prev, cur) })
}

// OnEndpointSlice passes an EndpointSlice change on.
func (p *Prefetched) OnEndpointSlice(prev, cur *discoveryv1.EndpointSlice) {
	p.deliver(func(t *target) { t.h.OnEndpointSlice(prev, cur) })
}

// OnNode passes a Node change on.
func (p *Prefetched) OnNode(prev, cur *corev1.Node) {
	p.deliver(func(t *target) { t.h.OnNode(prev, cur) })
}

// OnSynced passes the end of the initial objects on.
func (p *Prefetched) OnSynced() {
	p.deliver(func(t *target) { t.h.OnSynced() })
}

// OnSourceDown passes the report on, to a handler that is a Reporter.
func (p *Prefetched) OnSourceDown(err error) {
	p.deliver(func(t *target) {
		if r, ok := t.h.(Reporter); ok {
			r.OnSourceDown(err)
		}
	})
}

// OnSourceUp passes the report on, to a handler that is a Reporter.
func (p *Prefetched) OnSourceUp() {
	p.deliver(func(t *target) {
		if r, ok := t.h.(Reporter); ok {
			r.OnSourceUp()
		}
	})
}

// OnServiceCIDRs passes the ranges on, to a handler that takes them.
func (p *Prefetched) OnServiceCIDRs(cidrs []netip.Prefix) {
	p.deliver(func(t *target) {
		if c, ok := t.h.(ServiceCIDRHandler); ok {
			c.OnServiceCIDRs(cidrs)
		}
	})
}
