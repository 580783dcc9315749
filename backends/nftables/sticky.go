package nftables

import (
	"encoding/binary"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/sdk/plan"
)

// Services with ClientIP affinity get chains of their own, as in
// kube-proxy's nftables mode. The nft tool can list a rule only when no
// lookup key holds another lookup's result, so a client's endpoint cannot be
// kept as a bucket of the shared endpoints maps. Instead the one dynamic set
// `affinity` holds "client . service port . endpoint" entries that expire
// after the service's timeout. A service port's chain for each kind of
// traffic has a rule per endpoint that sends a client with an entry for that
// endpoint back to it, refreshing the entry; otherwise a rule per endpoint
// draws it by weight and records the client. The entries belong to the
// service port, not to a chain, so a client keeps its endpoint across the
// cluster IP, the node port and the external IPs, like kube-proxy; an
// endpoint that leaves takes its rules with it, so its clients draw again
// while the others stay. (One set per endpoint, kube-proxy's way, made a
// sync of 1k sticky services take 34 s: the kernel finds a rule's set by
// walking the table's list of sets.)

// setAffinity is the dynamic set of the clients' endpoints.
const setAffinity = "affinity"

// affinitySize bounds the affinity entries of a family (client, service
// port and endpoint): far more than the kernel's default of 65535 for a
// dynamic set.
const affinitySize = 1 << 20

// stickyChain names a service port's chain for one kind of traffic. The
// names are nft identifiers.
func stickyChain(kind pickKind, key plan.Key) string {
	return "sticky-" + pickNames[kind] + "-" + portName(key)
}

// portName is a service port's key in an nft identifier:
// namespace/name/port/protocol.
func portName(key plan.Key) string {
	return key.Namespace + "/" + key.Name + "/" + key.Port + "/" + strings.ToLower(string(key.Protocol))
}

// portID is the service port's part of an affinity entry: a 64-bit hash of
// its name, the same in every process, so entries outlive restarts.
func portID(port string) [8]byte {
	h := fnv.New64a()
	h.Write([]byte(port))
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], h.Sum64())
	return id
}

func isStickyChain(name string) bool { return strings.HasPrefix(name, "sticky-") }

// affinitySet returns the affinity set: client . service port (two words) .
// endpoint address . endpoint port.
func (l *layout) affinitySet() *nftables.Set {
	s := l.set(setAffinity, nftables.MustConcatSetType(l.fam.addrType, nftables.TypeMark, nftables.TypeMark,
		l.fam.addrType, nftables.TypeInetService))
	s.HasTimeout, s.Dynamic, s.Size = true, true, affinitySize
	return s
}

// weighted is one endpoint of a pool with its number of buckets.
type weighted struct {
	ep netip.AddrPort
	n  uint32
}

// distinct returns the pool's endpoints in bucket order, each with its
// number of buckets.
func (p pool) distinct() []weighted {
	var out []weighted
	for _, ep := range p.buckets {
		if n := len(out); n > 0 && out[n-1].ep == ep {
			out[n-1].n++
		} else {
			out = append(out, weighted{ep: ep, n: 1})
		}
	}
	return out
}

// sticky returns the chains a service port with ClientIP affinity owns,
// each with the draw it serves; none without affinity.
func (s *serviceState) sticky() map[string]draw {
	out := map[string]draw{}
	if s == nil || s.affinity == 0 {
		return out
	}
	for _, d := range s.draws() {
		out[stickyChain(d.kind, s.key)] = d
	}
	return out
}

// sameDraw reports whether two draws need the same sticky chain rules.
func sameDraw(a, b draw) bool {
	return a.kind == b.kind && a.pool.weight() == b.pool.weight() && changedBuckets(a.pool, b.pool) == nil
}

// addStickyChain appends the chain of service port s for d, which carries
// the port's comment, with its rules; with flush set the chain exists and
// is emptied first. A transaction encoded as it is built gets the
// per-endpoint rules from templates (stickytmpl.go), which
// TestStreamedBatchIsTheRecordedOne holds to the same bytes.
func (l *layout) addStickyChain(t *txn, s *serviceState, d draw, flush bool) {
	c := l.chain(stickyChain(d.kind, s.key))
	if flush {
		t.add(op{kind: opFlushChain, chain: c})
	} else {
		t.add(op{kind: opAddChain, chain: c, comment: s.comment})
	}
	port := portName(s.key)
	if t.out == nil {
		for _, r := range l.stickyRules(port, d, s.affinity) {
			t.add(op{kind: opAddRule, chain: c, rule: r})
		}
		return
	}
	for _, r := range l.kindRules(d.kind) {
		t.add(op{kind: opAddRule, chain: c, rule: r})
	}
	args := ruleArgs{portID: portID(port), timeout: s.affinity}
	for _, st := range stickySteps(d) {
		args.ep, args.mod, args.below = st.ep, st.mod, st.below
		t.add(op{kind: opAddRule, chain: c, tmpl: l.template(st.shape), args: args})
	}
}

// stickyShape is the shape of a sticky chain's per-endpoint rule.
type stickyShape uint8

const (
	// stepRefresh sends a client with an entry for the endpoint back to
	// it.
	stepRefresh stickyShape = iota
	// stepDraw draws the endpoint with numgen; stepTake, the last, takes
	// it without a draw.
	stepDraw
	stepTake
)

// stickyStep is one per-endpoint rule of a sticky chain: its shape, its
// endpoint and, for stepDraw, "numgen random mod mod < below".
type stickyStep struct {
	shape      stickyShape
	ep         netip.AddrPort
	mod, below uint32
}

// stickySteps returns the per-endpoint rules of d's sticky chain: a rule
// per endpoint for the clients it already serves, then a rule per
// endpoint drawing it by weight (endpoint i among the rest with the
// probability of its buckets among theirs; the last one takes what is
// left).
func stickySteps(d draw) []stickyStep {
	eps := d.pool.distinct()
	steps := make([]stickyStep, 0, 2*len(eps))
	for _, w := range eps {
		steps = append(steps, stickyStep{shape: stepRefresh, ep: w.ep})
	}
	rest := d.pool.weight()
	for i, w := range eps {
		st := stickyStep{shape: stepTake, ep: w.ep}
		if i < len(eps)-1 {
			st = stickyStep{shape: stepDraw, ep: w.ep, mod: rest, below: w.n}
		}
		steps = append(steps, st)
		rest -= w.n
	}
	return steps
}

// stickyRules returns a sticky chain's rules: the kind's, then those of
// stickySteps.
func (l *layout) stickyRules(port string, d draw, timeout uint32) []*rule {
	rules := l.kindRules(d.kind)
	for _, st := range stickySteps(d) {
		rules = append(rules, l.stepRule(port, st, timeout))
	}
	return rules
}

// stepRule returns the rule of one sticky step.
func (l *layout) stepRule(port string, st stickyStep, timeout uint32) *rule {
	var cond match
	switch st.shape {
	case stepRefresh:
		cond = l.affinityKey(port, st.ep).in(setAffinity)
	case stepDraw:
		cond = numgenBelow(st.mod, st.below)
	}
	return l.stickyRule(cond, port, st.ep, timeout)
}

// affinityKey is the affinity entry of the packet's client for ep of the
// service port.
func (l *layout) affinityKey(port string, ep netip.AddrPort) key {
	return keyOf(l.fam.saddrField(), portIDField(port), l.fam.addrField(ep.Addr()), portField(ep.Port()))
}

// stickyRule records the client's entry for ep, or refreshes it, and
// rewrites the destination to ep, when cond matches.
func (l *layout) stickyRule(cond match, port string, ep netip.AddrPort, timeout uint32) *rule {
	return ruleOf(cond, l.affinityKey(port, ep).update(setAffinity, timeout), l.fam.dnatTo(ep))
}

// addSticky appends what a service port's change needs before its entries
// change: its new chains and the rules of the chains whose draw changed.
func (l *layout) addSticky(t *txn, old, cur *serviceState) {
	was, now := old.sticky(), cur.sticky()
	for _, name := range slices.Sorted(maps.Keys(now)) {
		d := now[name]
		o, had := was[name]
		if had && sameDraw(o, d) && old.affinity == cur.affinity {
			continue
		}
		l.addStickyChain(t, cur, d, had)
	}
}

// delSticky appends what goes after the entries changed: the chains
// nothing sends packets to any more.
func (l *layout) delSticky(t *txn, was, now map[string]draw) {
	for _, name := range slices.Sorted(maps.Keys(was)) {
		if _, ok := now[name]; !ok {
			t.add(op{kind: opDelChain, chain: l.chain(name)})
		}
	}
}
