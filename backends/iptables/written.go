package iptables

import (
	"bytes"
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// chainSeed seeds the hashes of chain contents; they never leave the
// process.
var chainSeed = maphash.MakeSeed()

// chainSum is one chain a service wrote and a hash of its rules, enough to
// tell whether a later render changes it; with the number of its rules
// and of the service's rules that jump to it, which the periodic look at
// the kernel checks (see drift).
type chainSum struct {
	name        string
	sum         uint64
	rules, refs int32
}

// svcWritten is what one service port wrote in one family: its own (nat)
// chains and its rules in the fixed chains. Never modified once built.
type svcWritten struct {
	chains []chainSum
	rules  []sharedRule
	// endpoints is the service's count of endpoints, all families.
	endpoints int
	// masqRefs counts the service's rules that jump to KUBE-MARK-MASQ.
	masqRefs int32
	// ranged is set when the service's rules depend on the node's IP
	// (svcModel.ranged).
	ranged bool
}

// record returns what the service just rendered writes.
func (t *serviceText) record() *svcWritten {
	s := &svcWritten{chains: make([]chainSum, len(t.chains)), rules: slices.Clone(t.rules)}
	for i, c := range t.chains {
		text := t.text[c.start:c.end]
		s.chains[i] = chainSum{name: c.name, sum: maphash.Bytes(chainSeed, text), rules: int32(bytes.Count(text, []byte{'\n'}))}
	}
	s.countRefs(t)
	return s
}

// countRefs counts the jumps of the service's rules, in its chains and in
// the fixed ones, to its own chains and to KUBE-MARK-MASQ.
func (s *svcWritten) countRefs(t *serviceText) {
	var index map[string]int
	if len(s.chains) > 16 {
		index = make(map[string]int, len(s.chains))
		for i, c := range s.chains {
			index[c.name] = i
		}
	}
	ref := func(target []byte) {
		switch i, ok := index[string(target)]; {
		case target == nil:
		case string(target) == kubeMarkMasq:
			s.masqRefs++
		case ok:
			s.chains[i].refs++
		case index == nil:
			for i := range s.chains {
				if s.chains[i].name == string(target) {
					s.chains[i].refs++
					break
				}
			}
		}
	}
	for line := range bytes.Lines(t.text) {
		ref(jumpTarget(line))
	}
	for _, sr := range t.rules {
		ref(jumpTarget([]byte(sr.spec)))
	}
}

// jumpTarget returns what the rule (a line of restore text or a spec)
// jumps to with -j, or nil.
func jumpTarget(rule []byte) []byte {
	i := bytes.Index(rule, []byte(" -j "))
	switch {
	case bytes.HasPrefix(rule, []byte("-j ")):
		i = -1
	case i < 0:
		return nil
	}
	t := rule[i+4:]
	if j := bytes.IndexAny(t, " \n"); j >= 0 {
		t = t[:j]
	}
	return t
}

// minDelta is the least number of changes a written keeps over its base
// map before folding them in.
const minDelta = 64

// written remembers, per family, what the last successful restore left in
// the kernel (chains and their rules per service key, dispatch rules), so
// partial syncs need no read-back. Treated as immutable: render returns a
// new one; the old stays valid if the restore fails.
//
// Services live in base, overridden by delta (a nil entry: removed); a
// partial render copies only delta, and folds it into a new base once it
// grows past about sqrt(2 × services) entries: copying the delta and
// folding it in then cost about as much per partial render, a few dozen
// microseconds at 10k services.
type written struct {
	family ipFamily
	base   map[plan.Key]*svcWritten
	delta  map[plan.Key]*svcWritten
	// podCIDRs are the node's podCIDRs the rules use (DetectNodeCIDR).
	podCIDRs []netip.Prefix
	// trailer are the rules ending nat KUBE-SERVICES (node-port jumps).
	trailer []string
	// endpoints counts the plan's endpoints; quiet is largeCluster of it,
	// the renderer's setting for every chain written.
	endpoints int
	quiet     bool
	// nodeIP is the node's IP the rules were written with; ranged holds
	// the services whose rules depend on it, shared with the written this
	// one came from until set changes it (ownRanged).
	nodeIP    netip.Addr
	ranged    map[plan.Key]bool
	ownRanged bool
}

// service returns what key k wrote, or nil.
func (w *written) service(k plan.Key) *svcWritten {
	if s, ok := w.delta[k]; ok {
		return s
	}
	return w.base[k]
}

// next returns a copy to record a partial render in; w is not changed.
func (w *written) next() *written {
	n := *w
	n.delta = make(map[plan.Key]*svcWritten, len(w.delta)+4)
	maps.Copy(n.delta, w.delta)
	n.ownRanged = false
	return &n
}

// rangedKeys returns the services whose rules depend on the node's IP.
func (w *written) rangedKeys() []plan.Key {
	return slices.Collect(maps.Keys(w.ranged))
}

// setRanged records whether key k's rules depend on the node's IP,
// copying the shared set first when that changes it.
func (w *written) setRanged(k plan.Key, ranged bool) {
	if w.ranged[k] == ranged {
		return
	}
	if !w.ownRanged {
		w.ranged, w.ownRanged = maps.Clone(w.ranged), true
		if w.ranged == nil {
			w.ranged = map[plan.Key]bool{}
		}
	}
	if ranged {
		w.ranged[k] = true
	} else {
		delete(w.ranged, k)
	}
}

// set records what key k wrote now (nil: nothing). Only for a written
// that next returned.
func (w *written) set(k plan.Key, s *svcWritten) {
	w.setRanged(k, s != nil && s.ranged)
	if s == nil && w.base[k] == nil {
		delete(w.delta, k)
		return
	}
	w.delta[k] = s
}

// settle folds a large delta into a new base map.
func (w *written) settle() {
	if d := len(w.delta); d <= minDelta || d*d <= 2*len(w.base) {
		return
	}
	base := maps.Clone(w.base)
	for k, s := range w.delta {
		if s == nil {
			delete(base, k)
		} else {
			base[k] = s
		}
	}
	w.base, w.delta = base, nil
}

// each calls fn for every service that wrote something.
func (w *written) each(fn func(plan.Key, *svcWritten)) {
	for k, s := range w.base {
		if _, ok := w.delta[k]; !ok {
			fn(k, s)
		}
	}
	for k, s := range w.delta {
		if s != nil {
			fn(k, s)
		}
	}
}

// natChains returns the set of the services' chains.
func (w *written) natChains() map[string]bool {
	set := map[string]bool{}
	w.each(func(_ plan.Key, s *svcWritten) {
		for _, c := range s.chains {
			set[c.name] = true
		}
	})
	return set
}

// chainsOf lists, per table ("nat", "filter"), every chain w says is in
// the kernel; nil for a nil w. A full render given these as existing
// deletes those it no longer needs.
func chainsOf(w *written) map[string][]string {
	if w == nil {
		return nil
	}
	nat := slices.Clone(natChains)
	w.each(func(_ plan.Key, s *svcWritten) {
		for _, c := range s.chains {
			nat = append(nat, c.name)
		}
	})
	return map[string][]string{"nat": nat, "filter": slices.Clone(filterChains)}
}
