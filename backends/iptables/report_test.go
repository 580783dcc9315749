package iptables

import (
	"math/rand/v2"
	"testing"

	"github.com/weirproxy/weir/backends"
)

// TestOwnedRulesFollowPartialRenders applies random partial renders to the
// fake kernel and checks after each that the rule counts Report gives,
// carried over each render in proportion to the change, are the rules the
// kernel holds in each table.
func TestOwnedRulesFollowPartialRenders(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR, LocalhostNodePorts: true}}
	b := &Backend{opts: *o}
	rng := rand.New(rand.NewPCG(3, 5))
	p := goldPlan()
	for i := range 30 {
		s := randomService(rng, i)
		p.Services[s.Key] = s
	}
	full, w := renderFull(ipv4, p, o, nil)
	k := fakeKernel{}
	k.applyRestore(t, full)
	fam := &family{f: ipv4, last: w}
	wantOwned(t, b, fam, k, "after the full render")
	for step := range 200 {
		changed := mutate(rng, p)
		r, w := renderPartial(ipv4, p, changed, fam.last, o)
		k.applyRestore(t, r)
		fam.followPartial(w, changed, r.Full)
		fam.last = w
		if fam.owned.of != w {
			t.Fatalf("step %d: the count was not carried over the partial render", step)
		}
		wantOwned(t, b, fam, k, "after a partial render")
	}
}

// wantOwned compares the backend's rule counts with the rules in k.
func wantOwned(t *testing.T, b *Backend, fam *family, k fakeKernel, step string) {
	t.Helper()
	nat, filter := b.ownedRules(fam, goldPlan().Node)
	for table, got := range map[string]int{tableNAT: nat, tableFilter: filter} {
		want := 0
		for _, rules := range k[table] {
			want += len(rules)
		}
		if got != want {
			t.Fatalf("%s: %d rules counted in %s, the kernel holds %d", step, got, table, want)
		}
	}
}

// TestRulesIn counts the rules a restore text appends or inserts.
func TestRulesIn(t *testing.T) {
	text := "*nat\n:KUBE-SVC-X - [0:0]\n-S\n-D KUBE-SERVICES -j KUBE-SVC-Y\n-I KUBE-SERVICES -j KUBE-SVC-X\n" +
		"-A KUBE-SVC-X -j KUBE-SEP-X\n-X KUBE-SVC-Y\nCOMMIT\n"
	if n := rulesIn([]byte(text)); n != 2 {
		t.Errorf("rulesIn = %d, want 2 (one -I, one -A)", n)
	}
}
