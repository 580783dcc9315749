package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelReport checks, with each flavour, the figures Report gives
// after each Sync against the kernel: the rules in Weir's chains of each
// table and family as iptables-save lists them, the rules the Sync's
// restores wrote, and the restores that failed. A partial sync whose IPv4
// nat restore the kernel refuses, and the rewrite Sync then tries at once,
// which fails the same way, count two failures in IPv4, one of them
// partial, none in IPv6, and no rule counts: the Sync failed.
func TestKernelReport(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		web := dualStack("web", ktPodA, ktPodA6)
		p := ktPlan(web, ktService("other", ktVIP2, ktPodC))
		written := recordWrites(b)
		ktSync(t, b, p, backends.FullSync())
		wantReport(t, topo, b, written, "the first sync")

		b.rewrite = injectBadRule
		p.Services[web.Key] = dualStack("web", ktPodB, ktPodB6)
		if err := b.Sync(context.Background(), p, backends.PartialSync(web.Key)); err == nil {
			t.Fatal("a sync with a bad rule succeeded")
		}
		r := b.Report()
		want := []backends.FamilyReport{{Family: backends.IPv4, Failed: 2, FailedPartial: 1}, {Family: backends.IPv6}}
		if len(r.Families) != 2 || !sameFailures(r.Families[0], want[0]) || !sameFailures(r.Families[1], want[1]) {
			t.Errorf("after the failed sync: %+v, want %+v", r.Families, want)
		}

		written = recordWrites(b)
		ktSync(t, b, p, backends.PartialSync(web.Key))
		wantReport(t, topo, b, written, "the recovery")
		netns.WantPods(t, "after the recovery", netns.DialMany(t, topo.Client, ktAddr(ktVIP), 5), "pod-b")

		p.Services[web.Key] = dualStack("web", ktPodA, ktPodB, ktPodA6)
		written = recordWrites(b)
		ktSync(t, b, p, backends.PartialSync(web.Key))
		wantReport(t, topo, b, written, "a partial sync")
	})
}

// dualStack is a TCP service on ktVIP and ktVIP6, port 80, over pods.
func dualStack(name string, pods ...netip.Addr) *plan.Service {
	s := ktService(name, ktVIP, pods...)
	s.ClusterIPs = append(s.ClusterIPs, ktVIP6)
	return s
}

func ktAddr(vip netip.Addr) netip.AddrPort { return netip.AddrPortFrom(vip, 80) }

// recordWrites makes b count, per family and table, the rules of the
// restores it runs from now on (those of failed restores too: the test
// only uses it for Syncs that succeed at once).
func recordWrites(b *Backend) map[string]map[string]int {
	out := map[string]map[string]int{backends.IPv4: {}, backends.IPv6: {}}
	b.rewrite = func(f ipFamily, text []byte) []byte {
		out[familyName(f)][tableOf(text)] += rulesIn(text)
		return text
	}
	return out
}

// sameFailures compares the failure counts of two family reports and
// that got has no rule counts.
func sameFailures(got, want backends.FamilyReport) bool {
	return got.Family == want.Family && got.Failed == want.Failed && got.FailedPartial == want.FailedPartial && got.Tables == nil
}

// wantReport checks the Report of a Sync that succeeded: no failure, and
// per family and table the rules of Weir's chains in the kernel and those
// the Sync wrote.
func wantReport(t *testing.T, topo *netns.Topology, b *Backend, written map[string]map[string]int, step string) {
	t.Helper()
	b.rewrite = nil
	r := b.Report()
	if len(r.Families) != 2 {
		t.Fatalf("%s: report of %d families, want 2", step, len(r.Families))
	}
	for i, f := range []ipFamily{ipv4, ipv6} {
		fr := r.Families[i]
		if fr.Family != familyName(f) || fr.Failed != 0 || fr.FailedPartial != 0 {
			t.Errorf("%s: %s reported as %+v, want no failure", step, familyName(f), fr)
		}
		for _, table := range []string{tableNAT, tableFilter} {
			want := backends.Rules{Total: weirRules(ktSave(t, topo, b.fl, f, table)), Written: written[familyName(f)][table]}
			if got := fr.Tables[table]; got != want || want.Total == 0 {
				t.Errorf("%s: %s %s rules %+v, the kernel has %+v", step, familyName(f), table, got, want)
			}
		}
	}
}

// weirRules counts the rules of the KUBE-* chains in an iptables-save
// listing of one table: Weir's, without the jumps from built-in chains.
func weirRules(save string) int {
	n := 0
	for line := range strings.Lines(save) {
		if strings.HasPrefix(line, "-A KUBE-") {
			n++
		}
	}
	return n
}
