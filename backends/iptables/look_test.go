package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// fakeLook is what a look at the fake kernel's tables finds, counted from
// its rules independently of the backend's bookkeeping: each chain's rules
// (legacy) or its use, rules plus the rules jumping to it (nft). The jump
// rules, which go-iptables adds, are taken as present.
func fakeLook(k fakeKernel, withRefs bool) map[string]*tableLook {
	out := map[string]*tableLook{}
	for _, table := range []string{tableNAT, tableFilter} {
		l := newTableLook(withRefs)
		for chain, rules := range k[table] {
			l.counts[chain] += len(rules)
			for _, r := range rules {
				if _, ok := k[table][fakeTarget(r)]; withRefs && ok {
					l.counts[fakeTarget(r)]++
				}
			}
		}
		for _, j := range jumps {
			if j.table == table {
				l.jumps[j] = true
				if withRefs {
					l.baseRefs[j.to]++
					l.counts[j.to]++
				}
			}
		}
		out[table] = l
	}
	return out
}

// TestDriftOfWhatWasWritten checks the bookkeeping the periodic look
// compares with: for every golden plan and option set, and after every
// partial step, the fake kernel holding exactly what was written shows
// no drift, counted either way.
func TestDriftOfWhatWasWritten(t *testing.T) {
	cidrs := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	for _, c := range []struct {
		name string
		f    ipFamily
		o    *Options
		p    *plan.Plan
	}{
		{"clusterip", ipv4, cidrs, goldClusterPlan()},
		{"external", ipv4, cidrs, goldExternalPlan()},
		{"policy", ipv4, cidrs, goldPolicyPlan()},
		{"policy-masquerade-all", ipv4, &Options{Common: backends.Common{ClusterCIDRs: podCIDR, MasqueradeAll: true}}, goldPolicyPlan()},
		{"detect-clustercidrs", ipv4, &Options{Common: backends.Common{ClusterCIDRs: prefixes("10.244.0.0/16", "10.245.0.0/16")}}, goldDetectorPlan()},
		{"detect-interface", ipv4, &Options{Common: backends.Common{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth"}}, goldDetectorPlan()},
		{"nodeport-localhost", ipv4, &Options{Common: backends.Common{LocalhostNodePorts: true}}, goldPolicyPlan()},
		{"nodeport-cidrs", ipv4, &Options{Common: backends.Common{NodePortCIDRs: prefixes("192.168.0.0/24", "127.0.0.0/8")}}, goldDetectorPlan()},
		{"nodeport-primary", ipv4, &Options{Common: backends.Common{NodePortPrimary: true}}, goldDualStackPlan()},
		{"ipv6", ipv6, cidrs, goldDualStackPlan()},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, w := renderFull(c.f, c.p, c.o, nil)
			k := fakeKernel{}
			k.applyRestore(t, r)
			wantNoDrift(t, "full render", k, w, c.f, c.o, c.p)
		})
	}
	base := partialBase()
	full, prev := renderFull(ipv4, base, cidrs, nil)
	for _, step := range partialSteps {
		t.Run(step.name, func(t *testing.T) {
			p := base.Clone()
			changed := step.change(p)
			k := fakeKernel{}
			k.applyRestore(t, full)
			r, w := renderPartial(ipv4, p, changed, prev, cidrs)
			k.applyRestore(t, r)
			wantNoDrift(t, "partial render", k, w, ipv4, cidrs, p)
		})
	}
}

// wantNoDrift checks that looks at k, both ways, find what w says.
func wantNoDrift(t *testing.T, what string, k fakeKernel, w *written, f ipFamily, o *Options, p *plan.Plan) {
	t.Helper()
	for _, withRefs := range []bool{false, true} {
		if diffs, n, unknown := drift(w, newRenderer(f, o, p.Node), fakeLook(k, withRefs), 10); n > 0 || len(unknown) > 0 {
			t.Errorf("%s (counting jumps %v): %d differences %v, unknown chains %v", what, withRefs, n, diffs, unknown)
		}
	}
}

// TestDriftNamesDamage removes rules and chains from the fake kernel: the
// look's comparison must name each, with its service.
func TestDriftNamesDamage(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	p := goldExternalPlan()
	r, w := renderFull(ipv4, p, o, nil)
	np := chainsFor(servicePortName(key("np", "http", plan.TCP)), "tcp")
	for _, c := range []struct {
		name   string
		damage func(k fakeKernel)
		want   string
	}{
		{"kube-services-flushed", func(k fakeKernel) { k["nat"][kubeServices] = nil }, "nat chain KUBE-SERVICES has"},
		{"svc-chain-deleted", func(k fakeKernel) { fakeRemoveChain(k["nat"], np.svc) }, "nat chain " + np.svc + " (of default/np:http/TCP) is missing"},
		{"ext-rule-deleted", func(k fakeKernel) { k["nat"][np.ext] = k["nat"][np.ext][1:] }, "nat chain " + np.ext + " (of default/np:http/TCP) has"},
		{"reject-deleted", func(k fakeKernel) { k["filter"][kubeExternalServices] = nil }, "filter chain KUBE-EXTERNAL-SERVICES has"},
		{"rule-planted", func(k fakeKernel) { k["nat"][np.svc] = append(k["nat"][np.svc], "-j ACCEPT") }, "nat chain " + np.svc + " (of default/np:http/TCP) has"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, withRefs := range []bool{false, true} {
				k := fakeKernel{}
				k.applyRestore(t, r)
				c.damage(k)
				diffs, n, _ := drift(w, newRenderer(ipv4, o, p.Node), fakeLook(k, withRefs), 10)
				if n == 0 || !strings.Contains(strings.Join(diffs, "\n"), c.want) {
					t.Errorf("counting jumps %v: differences %v, want one saying %q", withRefs, diffs, c.want)
				}
			}
		})
	}
	look := fakeLook(fakeKernel{"nat": {}, "filter": {}}, true)
	look[tableNAT].jumps = map[jump]bool{}
	if diffs, _, _ := drift(w, newRenderer(ipv4, o, p.Node), look, 100); !strings.Contains(strings.Join(diffs, "\n"), "nat chain PREROUTING has no jump to KUBE-SERVICES") {
		t.Errorf("without jump rules the differences are %v, want the missing jumps", diffs)
	}
}

// fakeRemoveChain deletes chain and every rule jumping to it, as the
// kernel demands.
func fakeRemoveChain(t map[string][]string, chain string) {
	delete(t, chain)
	for c, rules := range t {
		var kept []string
		for _, r := range rules {
			if fakeTarget(r) != chain {
				kept = append(kept, r)
			}
		}
		t[c] = kept
	}
}

// TestJumpRestores checks that jump rules whose target chain is missing
// are added in one restore per table, each target declared once and the
// jumps of a built-in chain inserted so that they end up in the jumps
// table's order, and that the others are left to iptables -C.
func TestJumpRestores(t *testing.T) {
	look := map[string]*tableLook{tableNAT: newTableLook(false), tableFilter: newTableLook(false)}
	look[tableFilter].counts[kubeForward] = 0 // exists: its jump may be there
	texts, rest := jumpRestores(jumps, look)
	if len(rest) != 1 || rest[0].to != kubeForward {
		t.Errorf("left to check one by one: %v, want the jump to the existing %s", rest, kubeForward)
	}
	k := fakeKernel{"filter": {"INPUT": nil, "FORWARD": nil, "OUTPUT": nil, kubeForward: nil},
		"nat": {"PREROUTING": nil, "OUTPUT": nil, "POSTROUTING": nil}}
	for _, table := range []string{tableFilter, tableNAT} {
		if n := strings.Count(string(texts[table]), ":"+kubeServices+" "); n != 1 {
			t.Errorf("%s declares %s %d times:\n%s", table, kubeServices, n, texts[table])
		}
		if err := k.apply(texts[table]); err != nil {
			t.Fatalf("%s: %v\n%s", table, err, texts[table])
		}
	}
	var input []string
	for _, r := range k["filter"]["INPUT"] {
		input = append(input, fakeTarget(r))
	}
	if want := []string{kubeProxyFirewall, kubeNodePorts, kubeExternalServices}; !slices.Equal(input, want) {
		t.Errorf("filter INPUT jumps to %v, want %v", input, want)
	}
}
