package compare

import (
	"context"
	"errors"
	"sync"
	"time"
)

// maxOutstanding bounds the churn's API writes in flight (not the probing
// that follows a write); a write due while as many are outstanding is
// left out and counted: the API server does not keep up with the rate.
const maxOutstanding = 64

// churn writes EndpointSlice updates at cfg.ChurnRate for
// cfg.ChurnDuration, every other one a probe service's flip whose latency,
// API write to kernel, is measured, the others one endpoint of a load
// service moved, spread over the services. It then waits for every
// measured flip.
func (r *runner) churn(ctx context.Context, n *node, res *Result) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, maxOutstanding)
	)
	fail := func(err error) { cancel(err) }
	// Write k is due at begin + k/rate: a late one does not move the
	// later ones, so the phase writes rate × duration times.
	gap := time.Duration(float64(time.Second) / r.cfg.ChurnRate)
	begin := time.Now()
	end := begin.Add(r.cfg.ChurnDuration)
	res.ChurnRate = r.cfg.ChurnRate
	defer func() { res.ChurnFor = min(time.Since(begin), r.cfg.ChurnDuration) }()
	for k := 0; ; k++ {
		due := begin.Add(time.Duration(k+1) * gap)
		if due.After(end) || pace(ctx, due) != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		default:
			res.ChurnLate++ // the API server does not keep up: this write is left out
			continue
		}
		res.ChurnWrites++
		if svc := r.flipTarget(k, res); svc != nil {
			wg.Go(func() {
				took, err := r.measureFlip(ctx, n, svc, func() { <-sem })
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				res.Churn = append(res.Churn, took)
				mu.Unlock()
			})
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := r.moveEndpoint(ctx, k); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// flipTarget returns the probe service write k flips, or nil when write
// k moves a load endpoint: every odd write flips, unless every probe
// service has maxPending writes being measured.
func (r *runner) flipTarget(k int, res *Result) *probeService {
	if k%2 == 0 {
		return nil
	}
	svc := r.probes.acquire()
	if svc == nil {
		res.ChurnBusy++
	}
	return svc
}

// measureFlip flips svc and times it into the kernel; written is called
// once the write is done, before the probing.
func (r *runner) measureFlip(ctx context.Context, n *node, svc *probeService, written func()) (time.Duration, error) {
	defer r.probes.release(svc)
	k, sent, err := r.probes.flip(ctx, svc)
	written()
	if err != nil {
		return 0, err
	}
	at, err := n.awaitAnswer(ctx, svc, k, sent)
	if err != nil {
		return 0, err
	}
	return at.Sub(sent), nil
}

// moveEndpoint writes the next version of a load service's slice, the
// k-th of a stride through the services that visits each in turn.
func (r *runner) moveEndpoint(ctx context.Context, k int) error {
	n := r.size.Services
	i := (k / 2 * r.stride) % n
	r.mu.Lock()
	r.cluster.versions[i]++
	v := r.cluster.versions[i]
	r.mu.Unlock()
	return r.w.putSlice(ctx, loadSlice(i, r.size.Endpoints, v, false), false)
}

// stride is a step through n services that visits every one: a prime
// near 7919 with no factor in common with n.
func stride(n int) int {
	s := 7919
	for gcd(s, n) != 1 {
		s += 2
	}
	return s % max(n, 1)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
