package soak

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// target is one destination a probe may connect to, with the pods it may
// reach, from a snapshot of the model.
type target struct {
	service   string
	dest      dest
	allowed   map[string]bool // pod names
	lastWrite time.Time
	// model describes the service as the soak wrote it, for a report.
	model string
}

// probeStats counts probe outcomes, split by whether a fault window was
// open.
type probeStats struct {
	total, ok         int
	failed, wrong     int // outside fault windows
	failedIn, wrongIn int // inside
	// byWindow counts the failed and misrouted probes of each kind of
	// fault window.
	byWindow map[string]int
	examples []string
}

// prober connects from the client namespace to a rotating sample of the
// targets that have not changed for settle, a few at a time.
type prober struct {
	client  *netns.Namespace
	targets atomic.Pointer[[]target]
	// writes maps each service to its last write, published with the
	// targets: a probe of a service written while the probe was under way
	// says nothing and is not counted.
	writes atomic.Pointer[map[string]time.Time]
	// published is when targets and writes were last stored (Unix ns).
	published atomic.Int64
	// churning is set while churn steps may be writing.
	churning atomic.Bool
	windows  *windows
	settle   time.Duration
	// explain, when set, describes what Weir plans for a service, for the
	// first failures a report lists.
	explain func(ctx context.Context, service string) string

	mu    sync.Mutex
	stats probeStats
}

// maxExamples bounds the failures a report lists of each kind.
const maxExamples = 20

// run probes every interval until ctx is done.
func (p *prober) run(ctx context.Context, interval time.Duration) {
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ts := p.targets.Load()
		if ts == nil || len(*ts) == 0 {
			continue
		}
		t, ok := p.pick(*ts, &next)
		if !ok {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // four probes are still waiting for answers
		}
		wg.Go(func() {
			defer func() { <-sem }()
			p.probe(ctx, t)
		})
	}
}

// pick returns the next target, in rotation, that settled.
func (p *prober) pick(ts []target, next *int) (target, bool) {
	for range len(ts) {
		t := ts[*next%len(ts)]
		*next++
		if time.Since(t.lastWrite) >= p.settle && len(t.allowed) > 0 {
			return t, true
		}
	}
	return target{}, false
}

// probe makes one connection and records how it went.
func (p *prober) probe(ctx context.Context, t target) {
	begin := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	a, err := p.client.DialTCP(dctx, t.dest.addr)
	cancel()
	if ctx.Err() != nil || p.changed(t) {
		return
	}
	in := p.windows.openDuring(begin, time.Now())
	if time.Since(begin) > 2*time.Second+stallLimit {
		in = "machine stalled" // before the stall watcher could record it
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &p.stats
	st.total++
	var problem string
	switch {
	case err != nil:
		problem = fmt.Sprintf("failed: %v", err)
		if in != "" {
			st.failedIn++
		} else {
			st.failed++
		}
	case !t.allowed[a.Pod]:
		problem = fmt.Sprintf("reached %s, not in the plan (allowed %v)", a.Pod, keys(t.allowed))
		if in != "" {
			st.wrongIn++
		} else {
			st.wrong++
		}
	default:
		st.ok++
		return
	}
	if in != "" {
		if st.byWindow == nil {
			st.byWindow = map[string]int{}
		}
		st.byWindow[in]++
	}
	if in != "" || len(st.examples) >= maxExamples {
		return
	}
	example := fmt.Sprintf("%s %s via %s: %s\n      the soak wrote: %s", begin.UTC().Format("15:04:05.000"),
		t.service, t.dest, problem, t.model)
	if len(st.examples) < maxExplained && p.explain != nil {
		p.mu.Unlock()
		again := p.again(ctx, t)
		plan := p.explain(ctx, t.service)
		p.mu.Lock()
		example += fmt.Sprintf("\n      again at once: %s\n      weir plan says:\n%s", again, indent(plan, "        "))
	}
	st.examples = append(st.examples, example)
}

// changed reports whether t's service was written or deleted since t was
// published. It waits (up to a second) for the writes of the churn step
// under way to be published, so a write that began before the probe ended
// is seen.
func (p *prober) changed(t target) bool {
	end := time.Now().UnixNano()
	for deadline := time.Now().Add(time.Second); p.churning.Load() && p.published.Load() < end && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	w := p.writes.Load()
	if w == nil {
		return false
	}
	last, ok := (*w)[t.service]
	return !ok || last.After(t.lastWrite)
}

// maxExplained is how many failures the report explains in full.
const maxExplained = 5

// again repeats a probe three times and says how each went.
func (p *prober) again(ctx context.Context, t target) string {
	var out []string
	for range 3 {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		a, err := p.client.DialTCP(dctx, t.dest.addr)
		cancel()
		if err != nil {
			out = append(out, "failed")
		} else {
			out = append(out, a.Pod)
		}
	}
	return strings.Join(out, ", ")
}

func indent(text, prefix string) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

func (p *prober) snapshot() probeStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.examples = append([]string(nil), st.examples...)
	st.byWindow = maps.Clone(st.byWindow)
	return st
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// heldConn is a long-lived TCP connection through a service address; it
// sends a line every second and expects it back.
type heldConn struct {
	via  dest
	conn net.Conn
	r    *bufio.Reader
}

// holder keeps a few connections open through the held service.
type holder struct {
	client  *netns.Namespace
	windows *windows

	mu     sync.Mutex
	opened int
	lost   []string // what was lost, when, in which window
	lostIn map[string]int
}

// run keeps one connection to each of vias open until ctx is done,
// exchanging a line on each every interval; a lost connection is counted
// and replaced.
func (h *holder) run(ctx context.Context, vias []dest, interval time.Duration) {
	conns := make([]*heldConn, len(vias))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.conn.Close()
			}
		}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	seq := 0
	for {
		for i, via := range vias {
			if conns[i] == nil {
				conns[i] = h.open(ctx, via)
				continue
			}
			seq++
			if err := conns[i].ping(seq); err != nil && ctx.Err() == nil {
				h.lose(conns[i], err)
				conns[i].conn.Close()
				conns[i] = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *holder) open(ctx context.Context, via dest) *heldConn {
	var conn net.Conn
	err := h.client.Do(func() (err error) {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err = (&net.Dialer{}).DialContext(dctx, "tcp", via.addr.String())
		return err
	})
	if err != nil {
		return nil // tried again on the next tick
	}
	h.mu.Lock()
	h.opened++
	h.mu.Unlock()
	return &heldConn{via: via, conn: conn, r: bufio.NewReader(conn)}
}

// ping sends one line and reads it back within three seconds.
func (c *heldConn) ping(seq int) error {
	if err := c.conn.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return err
	}
	msg := fmt.Sprintf("ping %d\n", seq)
	if _, err := c.conn.Write([]byte(msg)); err != nil {
		return err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != msg {
		return fmt.Errorf("echo %q, want %q", line, msg)
	}
	return nil
}

func (h *holder) lose(c *heldConn, err error) {
	now := time.Now()
	in := h.windows.openDuring(now.Add(-4*time.Second), now)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lostIn == nil {
		h.lostIn = map[string]int{}
	}
	h.lostIn[in]++
	if len(h.lost) < maxExamples {
		h.lost = append(h.lost, fmt.Sprintf("%s connection via %s lost (fault window: %q): %v",
			now.UTC().Format("15:04:05.000"), c.via, in, err))
	}
}

// heldVias are the addresses the held connections go through.
func heldVias(s *service, nodeIP netip.Addr) []dest {
	var out []dest
	for _, d := range s.destinations(map[int]netip.Addr{4: nodeIP}) {
		if d.addr.Addr().Is4() {
			out = append(out, d, d) // two connections each
		}
	}
	return out
}
