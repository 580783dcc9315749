package nftables

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// TestKernelReportsFailedCommits deletes Weir's tables behind its back
// before partial syncs: the partial commit fails, Sync rebuilds the tables
// and succeeds, and Report counts the failed commit, as partial, in each
// family whose table it carried; the next Sync, which fails nothing,
// reports no failure.
func TestKernelReportsFailedCommits(t *testing.T) {
	topo, b := newCluster(t, Options{})
	dual := svc("default", "dual", "http", plan.TCP, vip.String(), 80, 0, podEP(podA, 1), ep("fd00:10:244::11", podPort, 1))
	dual.ClusterIPs = append(dual.ClusterIPs, netip.MustParseAddr("fd00:10:96::10"))
	web := svc("default", "web", "http", plan.TCP, "10.96.0.11", 80, 0, podEP(podB, 1))
	p := testPlan(dual, web)
	mustSync(t, b, p, backends.FullSync())
	wantFailures(t, b, "the first sync", [2][2]int{})

	deleteTables(t, topo.Node.Fd(), nftables.TableFamilyIPv4, nftables.TableFamilyIPv6)
	p.Services[dual.Key] = withEndpoints(dual, podEP(podB, 1), ep("fd00:10:244::12", podPort, 1))
	mustSync(t, b, p, backends.PartialSync(dual.Key))
	wantFailures(t, b, "a partial sync of a dual-stack service after both tables went", [2][2]int{{1, 1}, {1, 1}})

	deleteTables(t, topo.Node.Fd(), nftables.TableFamilyIPv4)
	p.Services[web.Key] = withEndpoints(web, podEP(podC, 1))
	mustSync(t, b, p, backends.PartialSync(web.Key))
	wantFailures(t, b, "a partial sync of an IPv4 service after its table went", [2][2]int{{1, 1}, {0, 0}})

	p.Services[web.Key] = withEndpoints(web, podEP(podA, 1))
	mustSync(t, b, p, backends.PartialSync(web.Key))
	wantFailures(t, b, "a partial sync that succeeds", [2][2]int{})
}

// withEndpoints returns a copy of s with other endpoints.
func withEndpoints(s *plan.Service, eps ...plan.Endpoint) *plan.Service {
	c := s.Clone()
	c.Endpoints = eps
	return c
}

// deleteTables deletes Weir's tables of the families, as another process
// would, over a netlink socket of its own in the network namespace fd.
func deleteTables(t *testing.T, fd int, families ...nftables.TableFamily) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		conn.DelTable(&nftables.Table{Name: "weir", Family: f})
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("delete Weir's tables: %v", err)
	}
}

// wantFailures checks the latest Report: want holds, for IPv4 then IPv6,
// the failed and the failed partial commits.
func wantFailures(t *testing.T, b *Backend, step string, want [2][2]int) {
	t.Helper()
	r := b.Report()
	if len(r.Families) != 2 {
		t.Fatalf("%s: report of %d families, want 2", step, len(r.Families))
	}
	for i, name := range []string{backends.IPv4, backends.IPv6} {
		f := r.Families[i]
		if f.Family != name || f.Failed != want[i][0] || f.FailedPartial != want[i][1] || f.Tables != nil {
			t.Errorf("%s: %+v, want %s with %d failed commits, %d of them partial, and no rule counts",
				step, f, name, want[i][0], want[i][1])
		}
	}
}
