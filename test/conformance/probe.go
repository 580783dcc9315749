package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// Proto is the transport a probe uses.
type Proto string

// The transports a probe can use; the zero Proto is TCP.
const (
	// TCP probes connect and read the pod's answer line.
	TCP Proto = "TCP"
	// UDP probes send one datagram and read the pod's answer datagram.
	UDP Proto = "UDP"
)

// Probe is a batch of connections (TCP) or exchanges (UDP, each a new flow
// unless FromPort is set) from one place to one address, and what they must
// give.
type Probe struct {
	// From is where the probe runs: "client", "node", or a pod's name.
	From string
	// To is the address dialled: "10.96.0.10:80", or "node:30080" for a
	// port on the node's address on the client link (its NodePort address).
	To string
	// Proto is TCP (the default) or UDP.
	Proto Proto
	// FromPort, for UDP, is the prober's source port. Zero uses a new
	// ephemeral port, so a new flow, for every attempt; a fixed port makes
	// every attempt, in this probe and in later ones with the same port,
	// one flow, as a long-lived client's (a DNS resolver's) is.
	FromPort uint16
	// Count is the number of attempts; zero picks enough for the want (see
	// Want).
	Count int
	// Want is what every attempt must give.
	Want Want
	// Source, for answered probes, is the source address the answering pod
	// must see: "client" (the client's address), "node" (the node's address:
	// masqueraded), "self" (the prober's own address: kept), or "" (not
	// checked).
	Source string
	// ByMode lists the modes that give something else than Want, where
	// kube-proxy's own modes differ and Weir's backend of each mode does
	// as kube-proxy in that mode: the backend under test, or kube-proxy in
	// RunExternal, must meet the want of its mode. Differs applies after.
	ByMode []ModeWant
	// Differs lists other proxies that give something else on purpose:
	// deliberate differences of Weir's, each explained in
	// docs/semantics.md. Weir must meet Want; RunExternal checks each
	// listed proxy against its Difference instead.
	Differs []Difference
}

// ModeWant is what one mode gives for a probe instead of its Want.
type ModeWant struct {
	Mode Mode
	// Want and Source replace the probe's.
	Want   Want
	Source string
	// Why says in a few words why the modes differ.
	Why string
}

// forMode returns the probe as a proxy of the given mode must pass it:
// with its mode's want and source in place of its own, when ByMode has
// one.
func (p Probe) forMode(m Mode) Probe {
	for _, w := range p.ByMode {
		if w.Mode == m {
			p.Want, p.Source = w.Want, w.Source
		}
	}
	p.ByMode = nil
	return p
}

// Want is the expected outcome of a probe; build it with Pods or OneOf, or
// use Refused, RefusedAtSend, Dropped or Unanswered.
type Want struct {
	kind wantKind
	pods []string
}

type wantKind uint8

const (
	wantPods wantKind = iota
	wantOneOf
	wantRefused
	wantRefusedAtSend
	wantDropped
	wantUnanswered
)

// Pods expects every attempt to be answered, by the named pods only, and
// each of them to answer at least once.
func Pods(names ...string) Want { return Want{kind: wantPods, pods: names} }

// OneOf expects every attempt to be answered by the same pod, one of the
// named ones (session affinity).
func OneOf(names ...string) Want { return Want{kind: wantOneOf, pods: names} }

// The outcomes of probes that no pod answers.
var (
	// Refused expects every attempt to be actively refused (TCP reset or
	// ICMP port unreachable), as for a service without endpoints, once
	// sent: a UDP datagram the prober's own namespace rejects on its way
	// out (the send fails with EPERM before the ICMP error arrives, as
	// with a reject on the node's output path) does not count.
	Refused = Want{kind: wantRefused}
	// RefusedAtSend expects every UDP attempt to be refused on the
	// prober's own output path: the send fails with EPERM, then the ICMP
	// error arrives (IPVS refusing the node's own datagram, say).
	RefusedAtSend = Want{kind: wantRefusedAtSend}
	// Dropped expects every attempt to get nothing back within 300 ms: the
	// packets are dropped.
	Dropped = Want{kind: wantDropped}
	// Unanswered expects no pod to answer, however the attempt fails: for
	// traffic the proxy must leave alone, whose fate is up to routing.
	Unanswered = Want{kind: wantUnanswered}
)

// String describes the want for failure messages.
func (w Want) String() string {
	switch w.kind {
	case wantPods:
		return "answers from exactly " + strings.Join(w.pods, ", ")
	case wantOneOf:
		return "every answer from one pod of " + strings.Join(w.pods, ", ")
	case wantRefused:
		return "connection refused"
	case wantRefusedAtSend:
		return "connection refused as it is sent (EPERM, then the ICMP error)"
	case wantDropped:
		return "dropped (timeout)"
	}
	return "no answer"
}

// Deadlines of one attempt.
const (
	// answerWait bounds an attempt that should be answered or refused.
	answerWait = 2 * time.Second
	// dropWait is how long an attempt that should get nothing waits.
	dropWait = 300 * time.Millisecond
)

// maxBad is how many attempts contradicting the want end a probe early.
const maxBad = 3

// contradicts reports whether one attempt's outcome alone shows that the
// want is not met.
func (w Want) contradicts(o outcome) bool {
	switch w.kind {
	case wantPods, wantOneOf:
		return o.err != nil || !slices.Contains(w.pods, o.answer.Pod)
	case wantRefused:
		return !errors.Is(o.err, netns.ErrRefused) || errors.Is(o.err, netns.ErrSendRejected)
	case wantRefusedAtSend:
		return !errors.Is(o.err, netns.ErrRefused) || !errors.Is(o.err, netns.ErrSendRejected)
	case wantDropped:
		return !errors.Is(o.err, netns.ErrTimeout)
	}
	return o.err == nil
}

// count returns the number of attempts: the probe's own, else enough that
// each of n uniformly chosen pods answers, and that a pod which should get
// no share would show up, with overwhelming probability (3 pods, 45 draws:
// one is missed with probability 3·(2/3)^45 ≈ 3e-8; one pod, 20 draws: an
// equal-share intruder hides with probability 2^-20).
func (p Probe) count() int {
	switch {
	case p.Count > 0:
		return p.Count
	case p.Want.kind == wantPods, p.Want.kind == wantOneOf:
		return max(20, 15*len(p.Want.pods))
	case p.Want.kind == wantRefused, p.Want.kind == wantRefusedAtSend:
		return 3
	}
	return 1
}

func (p Probe) proto() Proto {
	if p.Proto == "" {
		return TCP
	}
	return p.Proto
}

// String describes the probe for failure messages, e.g. "TCP from client
// to 10.96.0.10:80".
func (p Probe) String() string {
	from := p.From
	if p.FromPort != 0 {
		from = fmt.Sprintf("%s port %d", from, p.FromPort)
	}
	return fmt.Sprintf("%s from %s to %s", p.proto(), from, p.To)
}

// outcome is the result of one attempt.
type outcome struct {
	answer netns.Answer
	err    error
}

// probes runs a list of probes, each as the row's mode must pass it;
// prefix names the phase in messages.
func (r *rowRun) probes(t *testing.T, prefix string, list []Probe) {
	t.Helper()
	for _, p := range list {
		r.probe(t, prefix, p.forMode(r.mode))
	}
}

// probe runs one probe and reports every way it differs from its want.
func (r *rowRun) probe(t *testing.T, prefix string, p Probe) {
	t.Helper()
	what := prefix + p.String()
	if err := p.validate(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	to := r.target(p.To)
	from, self := r.prober(p.From, to.Addr().Is6())
	src := r.source(p.Source, self, to.Addr().Is6())
	wait := answerWait
	if p.Want.kind == wantDropped || p.Want.kind == wantUnanswered {
		wait = dropWait
	}
	attempt, done, err := attempter(p, from, netip.AddrPortFrom(self, p.FromPort), to)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer done()
	var outs []outcome
	bad := 0
	for range p.count() {
		if bad == maxBad {
			break // enough to report; do not wait out every deadline
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		var o outcome
		o.answer, o.err = attempt(ctx)
		cancel()
		if p.Want.contradicts(o) {
			bad++
		}
		outs = append(outs, o)
	}
	if msg := check(p, outs); msg != "" {
		t.Errorf("%s: want %s: %s", what, p.Want, msg)
	}
	if !src.IsValid() {
		return
	}
	for _, o := range outs {
		if o.err == nil && o.answer.Source.Addr() != src {
			t.Errorf("%s: %s saw source %s, want %s (%s)", what, o.answer.Pod, o.answer.Source, src, p.Source)
			return
		}
	}
}

// attempter returns the function making one attempt of p from ns to addr,
// and the function releasing what it holds. A UDP probe with a fixed source
// port (local) shares one socket across its attempts.
func attempter(p Probe, ns *netns.Namespace, local, to netip.AddrPort) (func(context.Context) (netns.Answer, error), func(), error) {
	switch {
	case p.proto() == TCP:
		return func(ctx context.Context) (netns.Answer, error) { return ns.DialTCP(ctx, to) }, func() {}, nil
	case p.FromPort == 0:
		return func(ctx context.Context) (netns.Answer, error) { return ns.AskUDP(ctx, to) }, func() {}, nil
	}
	c, err := ns.DialUDP(local, to)
	if err != nil {
		return nil, nil, err
	}
	return c.Ask, func() { c.Close() }, nil
}

// check compares a probe's outcomes with its want, ignoring sources, and
// describes what went wrong; "" means nothing did.
func check(p Probe, outs []outcome) string {
	tally := map[string]int{}
	var failed []error
	var unexpected error // the first outcome that contradicts the want
	for _, o := range outs {
		if o.err != nil {
			failed = append(failed, o.err)
		} else {
			tally[o.answer.Pod]++
		}
		if unexpected == nil && p.Want.contradicts(o) {
			unexpected = o.err
			if o.err == nil {
				unexpected = fmt.Errorf("answered by %s", o.answer)
			}
		}
	}
	got := fmt.Sprintf("%d attempts: answers %v", len(outs), tally)
	if len(failed) > 0 {
		got += fmt.Sprintf(", %d failed", len(failed))
	}
	if unexpected != nil {
		return fmt.Sprintf("%s; first contradicting outcome: %v", got, unexpected)
	}
	// Each outcome fits; together they must also cover every pod, or stick
	// to one.
	switch p.Want.kind {
	case wantPods:
		if len(tally) != len(p.Want.pods) {
			return got
		}
	case wantOneOf:
		if len(tally) != 1 {
			return got
		}
	}
	return ""
}

// validate checks the probe's fields, so that a mistake in a row fails at
// once and says what is wrong.
func (p Probe) validate() error {
	isPod := func(name string) bool {
		return slices.ContainsFunc(pods, func(s netns.PodSpec) bool { return s.Name == name })
	}
	if p.From != "client" && p.From != "node" && !isPod(p.From) {
		return fmt.Errorf("field From %q: want client, node or a pod name", p.From)
	}
	if port, ok := nodePort(p.To); ok {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("field To %q: bad port", p.To)
		}
	} else if _, err := netip.ParseAddrPort(p.To); err != nil {
		return fmt.Errorf("field To %q: want address:port, node:port or node6:port", p.To)
	}
	switch {
	case p.Proto != "" && p.Proto != TCP && p.Proto != UDP:
		return fmt.Errorf("field Proto %q: want TCP or UDP", p.Proto)
	case p.FromPort != 0 && p.proto() != UDP:
		return errors.New("field FromPort is for UDP probes only")
	case p.Want.kind == wantRefusedAtSend && p.proto() != UDP:
		return errors.New("want RefusedAtSend is for UDP probes only: a TCP connect does not report the failed send")
	case !slices.Contains([]string{"", "client", "node", "self"}, p.Source):
		return fmt.Errorf("field Source %q: want client, node, self or empty", p.Source)
	case p.Source != "" && p.Want.kind != wantPods && p.Want.kind != wantOneOf:
		return errors.New("field Source needs a want that is answered")
	case (p.Want.kind == wantPods || p.Want.kind == wantOneOf) && len(p.Want.pods) == 0:
		return errors.New("fields Pods or OneOf without pod names")
	}
	for _, name := range p.Want.pods {
		if !isPod(name) {
			return fmt.Errorf("want pod %q: no such pod", name)
		}
	}
	for i, d := range p.Differs {
		if d.Proxy == "" || d.Why == "" {
			return fmt.Errorf("field Differs[%d]: want the proxy and why Weir differs", i)
		}
		alt := p
		alt.Want, alt.Source, alt.Differs, alt.ByMode = d.Want, d.Source, nil, nil
		if err := alt.validate(); err != nil {
			return fmt.Errorf("field Differs[%d]: %w", i, err)
		}
	}
	return p.validateModes()
}

// validateModes checks the probe's ByMode entries: known modes, each once,
// with a reason and a valid want.
func (p Probe) validateModes() error {
	for i, w := range p.ByMode {
		switch {
		case !slices.Contains(modes, w.Mode):
			return fmt.Errorf("field ByMode[%d]: mode %q: want one of %v", i, w.Mode, modes)
		case slices.ContainsFunc(p.ByMode[:i], func(o ModeWant) bool { return o.Mode == w.Mode }):
			return fmt.Errorf("field ByMode[%d]: mode %s listed twice", i, w.Mode)
		case w.Why == "":
			return fmt.Errorf("field ByMode[%d]: want why mode %s differs", i, w.Mode)
		}
		alt := p
		alt.Want, alt.Source, alt.Differs, alt.ByMode = w.Want, w.Source, nil, nil
		if err := alt.validate(); err != nil {
			return fmt.Errorf("field ByMode[%d]: %w", i, err)
		}
	}
	return nil
}

// prober returns the namespace a (validated) probe runs in and the prober's
// own address in the target's family.
func (r *rowRun) prober(from string, v6 bool) (*netns.Namespace, netip.Addr) {
	switch from {
	case "client":
		return r.topo.Client, pick(v6, r.topo.ClientIP6, r.topo.ClientIP)
	case "node":
		return r.topo.Node, pick(v6, r.topo.NodeIP6, r.topo.NodeIP)
	}
	p := r.topo.Pods[from]
	return p.NS, pick(v6, p.IP6, p.IP)
}

func pick(v6 bool, a6, a4 netip.Addr) netip.Addr {
	if v6 {
		return a6
	}
	return a4
}

// nodePort returns the port of a "node:PORT" (node's IPv4 address) or
// "node6:PORT" (its IPv6 address) target.
func nodePort(to string) (string, bool) {
	if port, ok := strings.CutPrefix(to, "node:"); ok {
		return port, true
	}
	return strings.CutPrefix(to, "node6:")
}

// target resolves a (validated) probe's To.
func (r *rowRun) target(to string) netip.AddrPort {
	if port, ok := nodePort(to); ok {
		n, _ := strconv.ParseUint(port, 10, 16)
		return netip.AddrPortFrom(pick(strings.HasPrefix(to, "node6:"), r.topo.NodeIP6, r.topo.NodeIP), uint16(n))
	}
	return netip.MustParseAddrPort(to)
}

// source resolves a (validated) probe's Source; the zero address means not
// checked.
func (r *rowRun) source(src string, self netip.Addr, v6 bool) netip.Addr {
	switch src {
	case "client":
		return pick(v6, r.topo.ClientIP6, r.topo.ClientIP)
	case "node":
		return pick(v6, r.topo.NodeIP6, r.topo.NodeIP)
	case "self":
		return self
	}
	return netip.Addr{}
}
