package nftables

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/kernelver"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// fakeProbe is a batch that the fake and the kernel must both refuse with
// one errno, or both accept, after the same setup batch.
type fakeProbe struct {
	name         string
	setup, probe []op
	want         error // nil or an errno
}

// probeLayout builds the probes' objects in table ip weir-probe.
var probeLayout = &layout{table: &nftables.Table{Name: "weir-probe", Family: nftables.TableFamilyIPv4}, fam: famV4}

func probeElem(addr string) element { return addrElement(netip.MustParseAddr(addr)) }

// fakeProbes covers the kernel's answers the fake models.
func fakeProbes() []fakeProbe {
	l := probeLayout
	set, vmap := l.set("addrs", nftables.TypeIPAddr), l.dataMap("vmap", l.fam.ipKeyType(), nftables.TypeVerdict)
	ranges, allow := l.intervalSet("ranges"), l.firewallAllowSet()
	pick, other, base := l.chain("pick"), l.chain("other"), l.baseChain("hooked", nftables.ChainTypeFilter, nftables.ChainHookInput, 0)
	key := ipKey(netip.MustParseAddr("10.96.0.10"), plan.TCP, 80)
	toPick, toOther := gotoElement(key, "pick"), gotoElement(key, "other")
	objects := []op{{kind: opAddTable}, {kind: opAddSet, set: set}, {kind: opAddSet, set: vmap},
		{kind: opAddSet, set: ranges}, {kind: opAddSet, set: allow}, {kind: opAddChain, chain: pick},
		{kind: opAddChain, chain: other}, {kind: opAddChain, chain: base}}
	with := func(more ...op) []op { return append(append([]op(nil), objects...), more...) }
	elems := func(kind opKind, s *nftables.Set, e ...element) op {
		return op{kind: kind, set: s, elems: newElemList(l.table, s.Name, kind == opDelElems).addAll(e...)}
	}
	rule := func(c *nftables.Chain, exprs ...expr.Any) op {
		return op{kind: opAddRule, chain: c, rule: &rule{text: "probe", exprs: exprs}}
	}
	readAddrs := rule(other, famV4.loadDaddr(regKey), &expr.Lookup{SourceRegister: regKey, SetName: "addrs"})
	allowElem := allowElement(netip.MustParseAddr("198.51.100.5"), plan.TCP, 80, netip.MustParsePrefix("10.0.0.0/8"))
	wider := allowElement(netip.MustParseAddr("198.51.100.5"), plan.TCP, 80, netip.MustParsePrefix("10.1.0.0/16"))
	return []fakeProbe{
		{"the objects", nil, objects, nil},
		{"deleting an element that is not there", objects, []op{elems(opDelElems, set, probeElem("10.0.0.1"))}, unix.ENOENT},
		{"adding an element twice with the same data", with(elems(opAddElems, vmap, toPick)), []op{elems(opAddElems, vmap, toPick)}, nil},
		{"adding an element that exists with another verdict", with(elems(opAddElems, vmap, toPick)), []op{elems(opAddElems, vmap, toOther)}, unix.EEXIST},
		{"deleting a chain an element goes to", with(elems(opAddElems, vmap, toPick)), []op{{kind: opDelChain, chain: pick}}, unix.EBUSY},
		{"deleting a chain after the element going to it", with(elems(opAddElems, vmap, toPick)),
			[]op{elems(opDelElems, vmap, toPick), {kind: opDelChain, chain: pick}}, nil},
		{"deleting a chain a rule jumps to", with(rule(other, jumpTo("pick").exprs...)), []op{{kind: opDelChain, chain: pick}}, unix.EBUSY},
		{"deleting a chain with rules", with(rule(pick, verdictDrop().exprs...)), []op{{kind: opDelChain, chain: pick}}, nil},
		{"deleting a set a rule reads", with(readAddrs), []op{{kind: opDelSet, set: set}}, unix.EBUSY},
		{"deleting a set after flushing the chain reading it", with(readAddrs), []op{{kind: opFlushChain, chain: other}, {kind: opDelSet, set: set}}, nil},
		{"deleting a chain that is not there", objects, []op{{kind: opDelChain, chain: l.chain("missing")}}, unix.ENOENT},
		{"deleting a set that is not there", objects, []op{{kind: opDelSet, set: l.set("missing", nftables.TypeIPAddr)}}, unix.ENOENT},
		{"flushing a set that is not there", objects, []op{{kind: opFlushSet, set: l.set("missing", nftables.TypeIPAddr)}}, unix.ENOENT},
		{"a rule reading a register it did not load", objects, []op{rule(other, &expr.Lookup{SourceRegister: regKey, SetName: "addrs"})}, unix.ENODATA},
		{"a rule reading a missing set", objects, []op{rule(other, famV4.loadDaddr(regKey), &expr.Lookup{SourceRegister: regKey, SetName: "missing"})}, unix.ENOENT},
		{"a rule jumping to a missing chain", objects, []op{rule(other, jumpTo("missing").exprs...)}, unix.ENOENT},
		{"a rule jumping to a base chain", objects, []op{rule(other, jumpTo("hooked").exprs...)}, unix.EOPNOTSUPP},
		{"an element going to a missing chain", objects, []op{elems(opAddElems, vmap, gotoElement(key, "missing"))}, unix.ENOENT},
		{"a key of the wrong length", objects, []op{elems(opAddElems, set, element{key: key})}, unix.EINVAL},
		{"a set of another type under a name in use", objects, []op{{kind: opAddSet, set: l.set("addrs", nftables.TypeInetService)}}, unix.EEXIST},
		{"a set again with the same type", objects, []op{{kind: opAddSet, set: l.set("addrs", nftables.TypeIPAddr)}}, nil},
		{"overlapping ranges", with(elems(opAddElems, ranges, prefixElements([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})...)),
			[]op{elems(opAddElems, ranges, prefixElements([]netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")})...)}, unix.EEXIST},
		{"adjacent ranges", with(elems(opAddElems, ranges, prefixElements([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")})...)),
			[]op{elems(opAddElems, ranges, prefixElements([]netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")})...)}, nil},
		{"overlapping ranges of concatenations", with(elems(opAddElems, allow, allowElem)), []op{elems(opAddElems, allow, wider)}, unix.EEXIST},
		{"a range of concatenations again", with(elems(opAddElems, allow, allowElem)), []op{elems(opAddElems, allow, allowElem)}, nil},
		{"a policy on a regular chain", objects, []op{{kind: opAddChain, chain: withPolicy(l.chain("regular"))}}, unix.EOPNOTSUPP},
		{"a base chain again on another hook", objects,
			[]op{{kind: opAddChain, chain: l.baseChain("hooked", nftables.ChainTypeFilter, nftables.ChainHookOutput, 0)}}, unix.EOPNOTSUPP},
		{"a base chain again with another priority", objects,
			[]op{{kind: opAddChain, chain: l.baseChain("hooked", nftables.ChainTypeFilter, nftables.ChainHookInput, 5)}}, unix.EOPNOTSUPP},
		{"a base chain again of another type", objects,
			[]op{{kind: opAddChain, chain: l.baseChain("hooked", nftables.ChainTypeNAT, nftables.ChainHookInput, 0)}}, unix.EEXIST},
		{"a regular chain again as a base chain", objects,
			[]op{{kind: opAddChain, chain: l.baseChain("pick", nftables.ChainTypeFilter, nftables.ChainHookInput, 0)}}, unix.EOPNOTSUPP},
		{"a base chain again with its hook", objects, []op{{kind: opAddChain, chain: base}}, nil},
		{"a table deleted twice", objects, []op{{kind: opDelTable}, {kind: opDelTable}}, unix.ENOENT},
	}
}

func withPolicy(c *nftables.Chain) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	c.Policy = &accept
	return c
}

// answeredSince names the probes whose answer, which the fake gives,
// kernels older than the version given answer otherwise: Debian 12's 6.1
// (make test-vm) accepts the first two and refuses the last two with
// EEXIST. The fake keeps the newer, stricter or more precise answer; on an
// older kernel the kernel's side of such a probe is only logged.
var answeredSince = map[string]string{
	"a rule reading a register it did not load": "6.18",
	"overlapping ranges of concatenations":      "6.18",
	"a base chain again on another hook":        "6.18",
	"a base chain again with another priority":  "6.18",
}

// errnoOf returns the errno err carries, nil for nil, and err itself when
// it carries none.
func errnoOf(err error) error {
	var errno unix.Errno
	if err == nil || !errors.As(err, &errno) {
		return err
	}
	return errno
}

// TestKernelFakeAgrees sends each probe to the fake and to nf_tables in a
// namespace of its own: both must accept it or refuse it with the same
// errno, the one the fake's comment promises.
func TestKernelFakeAgrees(t *testing.T) {
	netns.RequireRoot(t)
	for _, p := range fakeProbes() {
		t.Run(p.name, func(t *testing.T) {
			topo := netns.NewT(t, netns.Options{})
			k, err := newNetlinkKernel(Options{Common: backends.Common{NetNS: topo.Node.Fd()}, Table: "weir-probe"}.withDefaults())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { k.close() })
			fake := newFakeKernel()
			older := false
			if v, ok := answeredSince[p.name]; ok {
				newer, err := kernelver.AtLeast(v)
				if err != nil {
					t.Fatal(err)
				}
				older = !newer
			}
			for name, kern := range map[string]kernel{"the kernel": k, "the fake": fake} {
				if err := sendOps(kern, p.setup); err != nil {
					t.Fatalf("%s refuses the setup: %v", name, err)
				}
				got := errnoOf(sendOps(kern, p.probe))
				switch {
				case fmt.Sprint(got) == fmt.Sprint(p.want):
				case older && kern == kernel(k):
					t.Logf("this kernel, older than %s, answers %v; the fake answers as newer ones do: %v", answeredSince[p.name], got, p.want)
				default:
					t.Errorf("%s answers %v, want %v", name, got, p.want)
				}
			}
		})
	}
}

// TestFakeRefusesLikeTheKernel runs the probes on the fake alone, for
// plain go test.
func TestFakeRefusesLikeTheKernel(t *testing.T) {
	for _, p := range fakeProbes() {
		fake := newFakeKernel()
		if err := sendOps(fake, p.setup); err != nil {
			t.Fatalf("%s: the fake refuses the setup: %v", p.name, err)
		}
		gen := fake.gen
		err := sendOps(fake, p.probe)
		if got := errnoOf(err); fmt.Sprint(got) != fmt.Sprint(p.want) {
			t.Errorf("%s: the fake answers %v, want %v", p.name, err, p.want)
		}
		if err != nil && fake.gen != gen {
			t.Errorf("%s: a refused batch changed the generation", p.name)
		}
	}
}

// sendOps commits ops on the probe table; nothing for no ops.
func sendOps(k kernel, ops []op) error {
	if len(ops) == 0 {
		return nil
	}
	return k.commit([]*txn{{table: probeLayout.table, ops: ops}})
}
