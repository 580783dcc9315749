//go:build vm

package ipvs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// TestKernelPipelineSettlesExistingAndGone: a partial sync that adds a
// virtual server and real server the kernel has already (behind the
// backend's back) updates them, and one that deletes a virtual server
// the kernel no longer has succeeds.
func TestKernelPipelineSettlesExistingAndGone(t *testing.T) {
	_, b := newCluster(t, Options{})
	one := service("one", plan.TCP, 80, 0, []string{vip.String()}, podEP(podA, 1))
	p := testPlan(one)
	mustSync(t, b, p, backends.FullSync())

	three := service("three", plan.UDP, 53, 0, []string{"10.96.0.12"}, podEP(podA, 2), podEP(podC, 3))
	three.Scheduler = plan.SchedulerWeightedRoundRobin
	threeVS := vsKey{addr: netip.MustParseAddr("10.96.0.12"), proto: plan.UDP, port: 53}
	addForeign(t, b, threeVS, netip.AddrPortFrom(podB, podPort), netip.AddrPortFrom(podC, podPort))
	p.Services[three.Key] = three
	mustSync(t, b, p, backends.PartialSync(three.Key))
	// pod-b stays: a partial sync reads nothing back.
	if got, want := kernelServers(t, b)[threeVS.String()], "wrr 10.244.0.11:8080 w2 10.244.0.12:8080 w1 10.244.0.13:8080 w3"; got != want {
		t.Errorf("after adding what existed: kernel has %q, want %q", got, want)
	}

	b.mu.Lock()
	err := b.ipvs.DelService(toService(threeVS, nil))
	b.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	delete(p.Services, three.Key)
	mustSync(t, b, p, backends.PartialSync(three.Key))
	if _, ok := kernelServers(t, b)[threeVS.String()]; ok {
		t.Error("deleted virtual server is back")
	}
}

// TestKernelPipelineErrorsNameTheirOp: a refused op is reported by name
// and not recorded; the ops after it in the same pipeline, over several
// writes, are still applied and recorded.
func TestKernelPipelineErrorsNameTheirOp(t *testing.T) {
	_, b := newCluster(t, Options{})
	bad := vsKey{addr: netip.MustParseAddr("10.96.0.20"), proto: plan.TCP, port: 80}
	good := vsKey{addr: netip.MustParseAddr("10.96.0.21"), proto: plan.TCP, port: 80}
	ops := []op{
		{kind: opAddVS, key: bad, vs: newVirtualServer("no-such-scheduler", 0)},
		{kind: opAddRS, key: bad, real: netip.AddrPortFrom(podA, podPort), weight: 1},
		{kind: opAddVS, key: good, vs: newVirtualServer("rr", 0)},
	}
	// Enough real servers for three writes.
	const reals = 2*maxInFlight + 10
	for i := range reals {
		a := netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)})
		ops = append(ops, op{kind: opAddRS, key: good, real: netip.AddrPortFrom(a, podPort), weight: 1})
	}
	b.mu.Lock()
	err := applyBatch(b.genl, b.programmed, ops, time.Now())
	recorded := b.programmed[good]
	_, badRecorded := b.programmed[bad]
	b.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), ops[0].String()) || !strings.Contains(err.Error(), "and 1 more") {
		t.Errorf("error %v: want it to name %q and count the refused add-rs", err, ops[0])
	}
	if errors.Is(err, unix.EEXIST) {
		t.Errorf("error %v", err)
	}
	if badRecorded {
		t.Error("refused virtual server recorded")
	}
	if recorded == nil || len(recorded.reals) != reals {
		t.Fatalf("good virtual server recorded with %v", recorded)
	}
	got := kernelServers(t, b)[good.String()]
	if n := strings.Count(got, " w1"); n != reals {
		t.Errorf("kernel has %d real servers for %s, want %d", n, good, reals)
	}
	if _, ok := kernelServers(t, b)[bad.String()]; ok {
		t.Errorf("refused virtual server %s is in the kernel", bad)
	}
}
