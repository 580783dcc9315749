package nftables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// Services with ClientIP affinity get chains of their own, built the way
// kube-proxy builds them. The nft tool can list a rule only when no lookup
// key holds another lookup's result, so a client's endpoint cannot be kept
// as a bucket of the shared endpoints maps. Instead every endpoint has a
// set of the clients it serves, whose entries expire after the service's
// timeout. The service's chain for each kind of traffic first sends a
// client found in one of those sets back to that endpoint, refreshing the
// entry; otherwise it draws an endpoint by weight and records the client
// in that endpoint's set. The sets belong to the service port and are
// shared by all its chains, so a client keeps its endpoint across the
// cluster IP, the node port and the external IPs, as with kube-proxy.

// stickyChain names a service port's chain for one kind of traffic. The
// names are nft identifiers, so a listing of the ruleset loads again.
func stickyChain(kind pickKind, key plan.Key) string {
	return "sticky-" + pickNames[kind] + "-" + portName(key)
}

// portName is a service port's key in an nft identifier:
// namespace/name/port/protocol.
func portName(key plan.Key) string {
	return key.Namespace + "/" + key.Name + "/" + key.Port + "/" + strings.ToLower(string(key.Protocol))
}

// affinitySet names the set of the clients an endpoint of a service port
// serves; port is the port's portName. An IPv6 address has its colons as
// dots, like kube-proxy's chain names.
func affinitySet(port string, ep netip.AddrPort) string {
	return fmt.Sprintf("affinity-%s-%s/%d", port, strings.ReplaceAll(ep.Addr().String(), ":", "."), ep.Port())
}

func isStickyChain(name string) bool { return strings.HasPrefix(name, "sticky-") }

func isAffinitySet(name string) bool { return strings.HasPrefix(name, "affinity-") }

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

// stickyObjects are the chains and sets a service port with ClientIP
// affinity owns: each chain with the draw it serves, and the sets.
type stickyObjects struct {
	chains map[string]draw
	sets   map[string]bool
}

// sticky returns the objects the state's affinity needs; empty without
// affinity.
func (s *serviceState) sticky() stickyObjects {
	o := stickyObjects{chains: map[string]draw{}, sets: map[string]bool{}}
	if s == nil || s.affinity == 0 {
		return o
	}
	for _, d := range s.draws() {
		o.chains[stickyChain(d.kind, s.key)] = d
		for _, ep := range d.pool.buckets {
			o.sets[affinitySet(portName(s.key), ep)] = true
		}
	}
	return o
}

// sameDraw reports whether two draws need the same sticky chain rules.
func sameDraw(a, b draw) bool {
	return a.kind == b.kind && a.pool.weight() == b.pool.weight() && changedBuckets(a.pool, b.pool) == nil
}

func (l *layout) affinitySet(name string) *nftables.Set {
	s := l.set(name, l.fam.addrType)
	s.HasTimeout, s.Dynamic = true, true
	return s
}

// addStickyChain appends a service port's chain for d with its rules;
// with flush set the chain exists and is emptied first.
func (l *layout) addStickyChain(t *txn, key plan.Key, d draw, timeout uint32, flush bool) {
	c := l.chain(stickyChain(d.kind, key))
	if flush {
		t.add(op{kind: opFlushChain, chain: c})
	} else {
		t.add(op{kind: opAddChain, chain: c})
	}
	for _, r := range l.stickyRules(portName(key), d, timeout) {
		t.add(op{kind: opAddRule, chain: c, rule: r})
	}
}

// stickyRules returns a sticky chain's rules: the kind's, a rule per
// endpoint for the clients it already serves, then a rule per endpoint
// drawing it by weight (endpoint i among the rest with the probability of
// its buckets among theirs; the last one takes what is left).
func (l *layout) stickyRules(port string, d draw, timeout uint32) []*rule {
	rules := l.kindRules(d.kind)
	eps := d.pool.distinct()
	for _, w := range eps {
		set := affinitySet(port, w.ep)
		rules = append(rules, l.stickyRule(
			[]expr.Any{l.fam.loadSaddr(regKey), lookup(regKey, set, false)}, "ip saddr @"+set+" ", set, w.ep, timeout))
	}
	rest := d.pool.weight()
	for i, w := range eps {
		var cond []expr.Any
		var text string
		if i < len(eps)-1 {
			cond = []expr.Any{
				&expr.Numgen{Register: regKey, Modulus: rest, Type: unix.NFT_NG_RANDOM},
				&expr.Byteorder{SourceRegister: regKey, DestRegister: regKey, Op: expr.ByteorderHton, Len: 4, Size: 4},
				&expr.Cmp{Op: expr.CmpOpLt, Register: regKey, Data: u32BE(w.n)},
			}
			text = fmt.Sprintf("numgen random mod %d < %d ", rest, w.n)
		}
		rules = append(rules, l.stickyRule(cond, text, affinitySet(port, w.ep), w.ep, timeout))
		rest -= w.n
	}
	return rules
}

// stickyRule records the client in set, or refreshes its entry, and
// rewrites the destination to ep, when cond matches.
func (l *layout) stickyRule(cond []expr.Any, condText, set string, ep netip.AddrPort, timeout uint32) *rule {
	exprs := append(cond,
		l.fam.loadSaddr(regKey),
		&expr.Dynset{SrcRegKey: regKey, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE,
			Timeout: time.Duration(timeout) * time.Second},
		&expr.Immediate{Register: l.fam.regEP(), Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: regLast, Data: port16(ep.Port())},
		l.fam.dnat(l.fam.regEP()))
	return &rule{
		text:  fmt.Sprintf("%supdate @%s { ip saddr timeout %ds } dnat to %s", condText, set, timeout, ep),
		exprs: exprs,
	}
}

// addSticky appends what a service port's change needs before its entries
// change: the sets of its new endpoints, its new chains and the rules of
// the chains whose draw changed.
func (l *layout) addSticky(t *txn, old, cur *serviceState) {
	was, now := old.sticky(), cur.sticky()
	for _, name := range slices.Sorted(maps.Keys(now.sets)) {
		if !was.sets[name] {
			t.add(op{kind: opAddSet, set: l.affinitySet(name)})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(now.chains)) {
		d := now.chains[name]
		o, had := was.chains[name]
		if had && sameDraw(o, d) && old.affinity == cur.affinity {
			continue
		}
		l.addStickyChain(t, cur.key, d, cur.affinity, had)
	}
}

// delSticky appends what goes after the entries changed: the chains
// nothing sends packets to any more, then the sets no chain reads.
func (l *layout) delSticky(t *txn, was, now stickyObjects) {
	for _, name := range slices.Sorted(maps.Keys(was.chains)) {
		if _, ok := now.chains[name]; !ok {
			t.add(op{kind: opDelChain, chain: l.chain(name)})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(was.sets)) {
		if !now.sets[name] {
			t.add(op{kind: opDelSet, set: l.affinitySet(name)})
		}
	}
}
