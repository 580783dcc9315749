package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// drainCheckEvery is how often the background loop looks at draining real
// servers. While none drain it only scans the virtual servers it
// programmed (no sorting, no kernel request).
const drainCheckEvery = time.Second

// connCounts is what the kernel reports about one real server.
type connCounts struct {
	active, inactive int
}

// reapable reports whether a draining real server can go: its connections
// have all ended, or the grace period is over.
func reapable(c connCounts, since, now time.Time, grace time.Duration) bool {
	return c.active+c.inactive == 0 || now.Sub(since) >= grace
}

// reap deletes the draining real servers whose connections have ended or
// whose grace period is over, and forgets those the kernel no longer has.
// It reads the real servers of only the virtual servers that have
// draining ones, and sends the deletions in one pipeline.
func (b *Backend) reap(now time.Time) error {
	var keys []vsKey
	for k, vs := range b.programmed {
		if len(vs.draining) > 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, vsKey.compare)
	var errs []error
	var ops []op
	for _, k := range keys {
		vs := b.programmed[k]
		counts, err := b.counts(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range slices.SortedFunc(maps.Keys(vs.draining), netip.AddrPort.Compare) {
			c, present := counts[a]
			if !present || reapable(c, vs.draining[a], now, b.opts.GracePeriod) {
				ops = append(ops, op{kind: opDelRS, key: k, real: a})
			}
		}
	}
	errs = append(errs, applyBatch(b.genl, b.programmed, ops, now))
	if err := firstOf(errs); err != nil {
		return fmt.Errorf("ipvs: graceful termination: %w", err)
	}
	return nil
}

// counts returns the connection counts of the real servers of k.
func (b *Backend) counts(k vsKey) (map[netip.AddrPort]connCounts, error) {
	dests, err := b.genl.dests(k)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list real servers of virtual server %s: %w", k, err)
	}
	out := make(map[netip.AddrPort]connCounts, len(dests))
	for _, d := range dests {
		if a, ok := fromDestination(d); ok {
			out[a] = connCounts{active: d.ActiveConnections, inactive: d.InactiveConnections}
		}
	}
	return out, nil
}

// drainLoop reaps draining real servers every drainCheckEvery until stop
// is closed.
func (b *Backend) drainLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(drainCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			b.mu.Lock()
			err := b.reap(b.now())
			b.mu.Unlock()
			if err != nil {
				b.log.Warn("Cannot finish graceful termination; will retry", "error", err)
			}
		}
	}
}
