package difftest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// Outcome is what one probe's attempts gave, in terms that do not depend
// on chance: the set of pods that answered and the sources they saw, the
// kinds of failure, and for a health check its answer.
type Outcome struct {
	// Pods are the pods that answered, sorted; for a sticky probe that one
	// pod answered everything, the single name "(one pod)", since which
	// pod a client sticks to is chance (see tally.outcome).
	Pods []string
	// Sources are the client addresses the pods saw, named: client, node,
	// pod-a..., loopback, gateway, else the address.
	Sources []string
	// Fails are the kinds of failed attempts: refused, timeout,
	// unreachable or error, each perhaps after "sender rejected" (see
	// failKind).
	Fails []string
	// Health is a health check's answer: "200 localEndpoints=1".
	Health string
	// Example is the text of one failure, for reports; not compared.
	Example string
}

// String is the outcome as compared.
func (o Outcome) String() string {
	var parts []string
	if len(o.Pods) > 0 {
		parts = append(parts, "answered by "+strings.Join(o.Pods, ","), "seeing "+strings.Join(o.Sources, ","))
	}
	if len(o.Fails) > 0 {
		parts = append(parts, strings.Join(o.Fails, "+"))
	}
	if o.Health != "" {
		parts = append(parts, o.Health)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ")
}

// Limits of one probe.
const (
	// attemptWait bounds one attempt; an attempt that gets nothing in that
	// time is a timeout (dropped).
	attemptWait = time.Second
	// maxAttempts bounds the attempts of a probe that is answered: enough
	// that a pod with an equal share among three is missed with
	// probability 3·(2/3)^40 ≈ 2e-7.
	maxAttempts = 40
	// failedAttempts end a probe whose first attempts all failed.
	failedAttempts = 3
	// stickyAttempts are the attempts of a sticky probe.
	stickyAttempts = 10
	// burstAttempts are made at once when the first attempts of a probe
	// that has candidates all failed: enough that a share of one in three
	// answered is missed with probability (2/3)^30 ≈ 5e-6, in the time of
	// one attempt.
	burstAttempts = 30
)

// tally counts one probe's attempts.
type tally struct {
	pods, sources, fails map[string]bool
	answers, attempts    int
	example              string
}

func newTally() *tally {
	return &tally{pods: map[string]bool{}, sources: map[string]bool{}, fails: map[string]bool{}}
}

// done reports whether the probe has seen enough.
func (t *tally) done(p Probe) bool {
	switch {
	case t.attempts >= maxAttempts:
		return true
	case t.answers == 0 && len(p.Candidates) == 0:
		return t.attempts >= failedAttempts
	case t.answers == 0:
		return t.attempts > failedAttempts // after the burst
	case t.answers < t.attempts: // answers and failures: look at all of it
		return false
	case p.Sticky:
		return t.attempts >= stickyAttempts
	}
	return t.attempts >= failedAttempts && len(t.pods) == len(p.Candidates)
}

// burst reports whether the probe should make a burst of attempts: its
// first attempts all failed, yet some pod might answer it.
func (t *tally) burst(p Probe) bool {
	return t.answers == 0 && t.attempts == failedAttempts && len(p.Candidates) > 0
}

func (t *tally) add(a netns.Answer, err error, namer func(netip.Addr) string) {
	t.attempts++
	if err != nil {
		kind := failKind(err)
		t.fails[kind] = true
		if t.example == "" {
			t.example = err.Error()
		}
		return
	}
	t.answers++
	t.pods[a.Pod] = true
	t.sources[namer(a.Source.Addr())] = true
}

func (t *tally) outcome(p Probe) Outcome {
	o := Outcome{Pods: sortedKeys(t.pods), Sources: sortedKeys(t.sources), Fails: sortedKeys(t.fails), Example: t.example}
	switch {
	case !p.Sticky:
	case slices.Contains(p.Candidates, p.From) && (len(o.Pods) == 1 && len(o.Fails) == 0 || len(o.Pods) == 0 && slices.Equal(o.Fails, []string{"timeout"})):
		// Whether a pod sticks to itself or to another is chance, and
		// with it the source seen, or whether it reaches itself at all
		// (the hairpin of an endpoint placed elsewhere is not
		// masqueraded): the non-sticky probes compare those.
		o.Pods, o.Sources, o.Fails = []string{"(one pod, or itself unanswered)"}, nil, nil
	case len(o.Pods) == 1:
		o.Pods = []string{"(one pod)"}
	}
	return o
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// failKind names how an attempt failed: refused, unreachable, timeout or
// error, with "sender rejected " before it when the sender's own kernel
// refused to send (EPERM: a rule on the output path dropped or rejected
// the datagram; then only a reject's ICMP error tells the two apart).
func failKind(err error) string {
	rejected := errors.Is(err, syscall.EPERM)
	kind := "error"
	switch {
	case errors.Is(err, netns.ErrRefused):
		kind = "refused"
	case errors.Is(err, netns.ErrUnreachable):
		kind = "unreachable"
	case errors.Is(err, netns.ErrTimeout), rejected:
		kind = "timeout"
	}
	if rejected {
		return "sender rejected " + kind
	}
	return kind
}

// prober runs probes in one topology.
type prober struct {
	topo *netns.Topology
	// http clients by namespace, for health checks.
	mu   sync.Mutex
	http map[*netns.Namespace]*http.Client
}

// namespace returns where a probe runs.
func (pr *prober) namespace(from string) *netns.Namespace {
	switch from {
	case "client":
		return pr.topo.Client
	case "node":
		return pr.topo.Node
	}
	return pr.topo.Pods[from].NS
}

// name names a source address a pod saw.
func (pr *prober) name(a netip.Addr) string {
	switch a {
	case pr.topo.ClientIP:
		return "client"
	case pr.topo.NodeIP:
		return "node"
	case loopback:
		return "loopback"
	case gateway:
		return "gateway"
	}
	if p := podOf(a.String()); p != "" {
		return p
	}
	return a.String()
}

// run makes the probe's attempts.
func (pr *prober) run(ctx context.Context, p Probe) Outcome {
	ns := pr.namespace(p.From)
	if p.Proto == "HTTP" {
		return pr.health(ctx, ns, p)
	}
	t := newTally()
	for !t.done(p) && ctx.Err() == nil {
		if t.burst(p) {
			pr.burst(ctx, ns, p, t)
			continue
		}
		a, err := attempt(ctx, ns, p)
		t.add(a, err, pr.name)
	}
	return t.outcome(p)
}

// burst makes burstAttempts attempts at once and adds them to t.
func (pr *prober) burst(ctx context.Context, ns *netns.Namespace, p Probe, t *tally) {
	type result struct {
		a   netns.Answer
		err error
	}
	results := make(chan result, burstAttempts)
	for range burstAttempts {
		go func() {
			a, err := attempt(ctx, ns, p)
			results <- result{a, err}
		}()
	}
	for range burstAttempts {
		r := <-results
		t.add(r.a, r.err, pr.name)
	}
}

// attempt makes one connection (TCP) or exchange (UDP) of the probe.
func attempt(ctx context.Context, ns *netns.Namespace, p Probe) (netns.Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptWait)
	defer cancel()
	if p.Proto == "UDP" {
		return ns.AskUDP(ctx, p.To)
	}
	return ns.DialTCP(ctx, p.To)
}

// health asks a health-check node port, as a load balancer does, and
// notes its status and localEndpoints.
func (pr *prober) health(ctx context.Context, ns *netns.Namespace, p Probe) Outcome {
	pr.mu.Lock()
	c := pr.http[ns]
	if c == nil {
		c = ns.HTTPClient(attemptWait)
		pr.http[ns] = c
	}
	pr.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.To.String()+"/", nil)
	if err != nil {
		return Outcome{Fails: []string{"error"}, Example: err.Error()}
	}
	res, err := c.Do(req)
	if err != nil {
		return Outcome{Fails: []string{healthFail(err)}, Example: err.Error()}
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	var doc struct {
		LocalEndpoints *int `json:"localEndpoints"`
	}
	if json.Unmarshal(body, &doc) != nil || doc.LocalEndpoints == nil {
		return Outcome{Health: fmt.Sprintf("%d (body %q)", res.StatusCode, body)}
	}
	return Outcome{Health: fmt.Sprintf("%d localEndpoints=%d", res.StatusCode, *doc.LocalEndpoints)}
}

// healthFail names how a health check failed.
func healthFail(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(err.Error(), "Timeout"):
		return "timeout"
	}
	return "error"
}
