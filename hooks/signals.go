package hooks

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// SignalSource reads the live signals of services' endpoints from the
// kernel: core/conntrack's Load in the nftables and iptables modes, the
// IPVS backend in IPVS mode.
type SignalSource interface {
	// Signals returns, for each service, the signals of its endpoints,
	// aligned with services[i].Endpoints; nil for a service it did not
	// read (a reading cut short by its time budget), whose previous
	// reading then stands.
	Signals(ctx context.Context, services []*plan.Service) ([][]abi.Signals, error)
}

// signalState is what a plugin with signals remembers of them, guarded by
// Chain.mu.
type signalState struct {
	next time.Time // when its signals are next read
	// latest holds each service's last reading; moved, the services whose
	// reading differs from what the plugin was last sent.
	latest map[plan.Key]reading
	moved  map[plan.Key]bool
}

// reading is the signals of one service's endpoints, aligned with the
// endpoints of in, the service they were read for.
type reading struct {
	in  *plan.Service
	sig []abi.Signals
}

func newSignalState() *signalState {
	return &signalState{latest: map[plan.Key]reading{}, moved: map[plan.Key]bool{}}
}

// stale reports whether the plugin must see k again for its signals; it
// is false for a plugin without signals.
func (st *signalState) stale(k plan.Key) bool { return st != nil && st.moved[k] }

// sent records that the plugin was sent k's latest signals.
func (st *signalState) sent(k plan.Key) {
	if st != nil {
		delete(st.moved, k)
	}
}

// forget drops what the state holds of k.
func (st *signalState) forget(k plan.Key) {
	if st != nil {
		delete(st.latest, k)
		delete(st.moved, k)
	}
}

// of returns the signals of svc's endpoints from its latest reading; nil
// when there is none.
func (st *signalState) of(svc *plan.Service) []abi.Signals {
	r, ok := st.latest[svc.Key]
	if !ok {
		return nil
	}
	return r.signalsFor(svc)
}

// signalsFor returns r's signals laid out for svc's endpoints: as read
// when r was read for svc itself, else matched by address and port (zero
// for endpoints the reading did not cover).
func (r reading) signalsFor(svc *plan.Service) []abi.Signals {
	if r.in == svc {
		return r.sig
	}
	by := make(map[netip.AddrPort]abi.Signals, len(r.sig))
	for i, s := range r.sig {
		by[r.in.Endpoints[i].AddrPort()] = s
	}
	out := make([]abi.Signals, len(svc.Endpoints))
	for i := range svc.Endpoints {
		out[i] = by[svc.Endpoints[i].AddrPort()]
	}
	return out
}

// SignalInterval returns the shortest Interval of the plugins with
// signals, how often Poll is worth calling; 0 when no plugin has signals.
func (c *Chain) SignalInterval() time.Duration {
	var d time.Duration
	for _, s := range c.slots {
		if s.sig != nil && (d == 0 || s.Interval < d) {
			d = s.Interval
		}
	}
	return d
}

// target is one service a plugin with signals last saw, as it saw it.
type target struct {
	s  *slot
	in *plan.Service
}

// Poll reads, for each plugin with signals whose interval has passed, the
// signals of the services it last saw, and returns the keys of those whose
// signals moved since the plugin was last sent them: the next Apply of
// these services calls the plugin again (an Apply of their unchanged
// planned services is enough), and a plugin output that stays the same
// changes nothing after it. The source is read once, without the chain's
// lock, for every due plugin together.
func (c *Chain) Poll(ctx context.Context, src SignalSource) ([]plan.Key, error) {
	targets, services := c.targets()
	if len(targets) == 0 {
		return nil, nil
	}
	sigs, err := src.Signals(ctx, services)
	if err != nil {
		return nil, err
	}
	byService := make(map[*plan.Service][]abi.Signals, len(services))
	for i, svc := range services {
		if i < len(sigs) && sigs[i] != nil {
			byService[svc] = sigs[i]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var moved []plan.Key
	added := map[plan.Key]bool{}
	for _, t := range targets {
		if e, ok := t.s.cache[t.in.Key]; !ok || e.in != t.in {
			continue // the service changed meanwhile: the sync that changed it sent it
		}
		sig, read := byService[t.in]
		if !read {
			continue
		}
		if t.s.sig.update(t.in, sig) && !added[t.in.Key] {
			added[t.in.Key] = true
			moved = append(moved, t.in.Key)
		}
	}
	return moved, nil
}

// targets returns the services the due plugins with signals last saw, and
// those services once each, and schedules the plugins' next readings.
func (c *Chain) targets() ([]target, []*plan.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil
	}
	now := c.opts.Now()
	var targets []target
	var services []*plan.Service
	seen := map[*plan.Service]bool{}
	for _, s := range c.slots {
		if s.sig == nil || s.p == nil || now.Before(s.sig.next) {
			continue
		}
		s.sig.next = now.Add(s.Interval)
		for _, e := range s.cache {
			targets = append(targets, target{s: s, in: e.in})
			if !seen[e.in] {
				seen[e.in] = true
				services = append(services, e.in)
			}
		}
	}
	return targets, services
}

// update stores a new reading of in's signals and reports whether it
// differs from the previous one.
func (st *signalState) update(in *plan.Service, sig []abi.Signals) bool {
	if len(sig) != len(in.Endpoints) {
		sig = make([]abi.Signals, len(in.Endpoints)) // a source that broke its contract
	}
	prev, ok := st.latest[in.Key]
	st.latest[in.Key] = reading{in: in, sig: sig}
	if ok && slices.Equal(sig, prev.signalsFor(in)) && !st.moved[in.Key] {
		return false
	}
	if !ok && allZero(sig) {
		return false // the plugin was sent zeros
	}
	st.moved[in.Key] = true
	return true
}

func allZero(sig []abi.Signals) bool {
	for _, s := range sig {
		if s != (abi.Signals{}) {
			return false
		}
	}
	return true
}

// signalsOf returns the signals to send s for the services in.
func (s *slot) signalsOf(in []*plan.Service) [][]abi.Signals {
	out := make([][]abi.Signals, len(in))
	for i, svc := range in {
		out[i] = s.sig.of(svc)
	}
	return out
}
