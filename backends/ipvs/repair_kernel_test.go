//go:build vm

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// Objects an operator or another tool removes behind Weir's back: a
// periodic full sync repairs what it can see, and a partial sync that runs
// into the damage rebuilds at once instead of failing.

// repairFixture is a node where the backend serves web (cluster IP and
// node port, masqueraded from the client as the ClusterCIDRs detector
// says) and the plan that adds pod-c to it.
type repairFixture struct {
	topo *netns.Topology
	b    *Backend
	p    *plan.Plan
	web  *plan.Service
	fl   string
}

func newRepairFixture(t *testing.T, fl string) *repairFixture {
	t.Helper()
	opts := Options{Flavour: fl}
	opts.ClusterCIDRs = []netip.Prefix{netns.DefaultPodCIDR}
	topo, b := newCluster(t, opts)
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1))
	other := service("other", plan.UDP, 53, 0, []string{"10.96.0.11"}, podEP(podC, 1))
	f := &repairFixture{topo: topo, b: b, p: testPlan(web, other), web: web, fl: fl}
	mustSync(t, b, f.p, backends.FullSync())
	f.check(t, "before the damage", "pod-a", "pod-b")
	return f
}

// divergences reads the kernel back and compares it with the plan.
func (f *repairFixture) divergences(t *testing.T) string {
	t.Helper()
	got, err := f.b.ReadBack(context.Background())
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	want, owners := f.b.Expected(f.p)
	var lines []string
	for _, d := range backends.Compare(want, owners, got) {
		lines = append(lines, d.String())
	}
	return strings.Join(lines, "\n")
}

// addPodC changes web in the plan: pod-c joins.
func (f *repairFixture) addPodC() {
	web := f.web.Clone()
	web.Endpoints = append(web.Endpoints, podEP(podC, 1))
	f.p.Services[web.Key] = web
}

// check dials web's cluster IP and node port from the client: pods answer,
// and the cluster IP is masqueraded (the client is no pod); then the
// kernel read back matches the plan.
func (f *repairFixture) check(t *testing.T, what string, pods ...string) {
	t.Helper()
	f.checkWeb(t, what, pods...)
	if d := f.divergences(t); d != "" {
		t.Errorf("%s: the kernel read back diverges from the plan:\n%s", what, d)
	}
}

// checkWeb is check without the read-back: after a partial sync, damage
// to other services stays until the next full sync.
func (f *repairFixture) checkWeb(t *testing.T, what string, pods ...string) {
	t.Helper()
	answers := netns.DialMany(t, f.topo.Client, netip.AddrPortFrom(vip, 80), 6*len(pods))
	netns.WantPods(t, what+": cluster IP", answers, pods...)
	for _, a := range answers {
		if a.Source.Addr() != f.topo.NodeIP {
			t.Errorf("%s: cluster IP: %s saw %s, want the node's %s (masqueraded)", what, a.Pod, a.Source.Addr(), f.topo.NodeIP)
			break
		}
	}
	netns.WantPods(t, what+": node port", netns.DialMany(t, f.topo.Client, netip.AddrPortFrom(f.topo.NodeIP, 30080), 6*len(pods)), pods...)
}

// ipvsBehindTheBack opens an IPVS handle of its own in the node.
func (f *repairFixture) ipvsBehindTheBack(t *testing.T) *ipvs.Handle {
	t.Helper()
	h, err := ipvs.New(fmt.Sprintf("/proc/self/fd/%d", f.topo.Node.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// netlinkBehindTheBack opens a netlink handle of its own in the node.
func (f *repairFixture) netlinkBehindTheBack(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(f.topo.Node.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// iptables runs the fixture's iptables flavour (ip6tables with family 6)
// in the node.
func (f *repairFixture) iptables(t *testing.T, family int, args ...string) {
	t.Helper()
	bin := "/usr/sbin/iptables-" + f.fl
	if family == 6 {
		bin = "/usr/sbin/ip6tables-" + f.fl
	}
	var out []byte
	err := f.topo.Node.Do(func() (err error) {
		out, err = exec.Command(bin, args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s %v: %v: %s", bin, args, err, out)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// damage is one thing removed behind Weir's back.
type damage struct {
	name string
	do   func(t *testing.T, f *repairFixture)
	// diverges is a line Compare(Expected, ReadBack) must show after it.
	diverges string
	// partialRepairs says that a partial sync of web repairs all of it;
	// otherwise the partial sync only must not fail, and the next full
	// sync repairs.
	partialRepairs bool
}

var webVS = vsKey{addr: vip, proto: plan.TCP, port: 80}

var damages = []damage{
	{name: "all-virtual-servers", partialRepairs: true, diverges: webCluster + ": destination: want present (forward), got missing", do: func(t *testing.T, f *repairFixture) {
		must(t, "ipvsadm -C", f.ipvsBehindTheBack(t).Flush())
	}},
	{name: "one-virtual-server", partialRepairs: true, diverges: webCluster + ": destination: want present (forward), got missing", do: func(t *testing.T, f *repairFixture) {
		must(t, "delete "+webVS.String(), f.ipvsBehindTheBack(t).DelService(toService(webVS, nil)))
	}},
	{name: "one-real-server", diverges: webCluster + ": endpoints: want 10.244.0.11:8080*1 10.244.0.12:8080*1, got 10.244.0.12:8080*1", do: func(t *testing.T, f *repairFixture) {
		must(t, "delete pod-a", f.ipvsBehindTheBack(t).DelDestination(toService(webVS, nil), toDestination(netip.AddrPortFrom(podA, podPort), 1)))
	}},
	{name: "dummy-interface", partialRepairs: true, diverges: "anomaly: interface weir-ipvs0 is missing", do: func(t *testing.T, f *repairFixture) {
		h := f.netlinkBehindTheBack(t)
		l, err := h.LinkByName(DefaultInterface)
		must(t, "find "+DefaultInterface, err)
		must(t, "delete "+DefaultInterface, h.LinkDel(l))
	}},
	{name: "one-address", diverges: webCluster + ": destination: want present (forward), got missing", do: func(t *testing.T, f *repairFixture) {
		h := f.netlinkBehindTheBack(t)
		l, err := h.LinkByName(DefaultInterface)
		must(t, "find "+DefaultInterface, err)
		must(t, "delete "+vip.String(), h.AddrDel(l, hostAddr(vip)))
	}},
	{name: "ipset-flushed", diverges: "anomaly: virtual servers on weir-ipvs0 in neither WEIR-IPVS-CLUSTER-IP nor WEIR-IPVS-EXTERNAL", do: func(t *testing.T, f *repairFixture) {
		must(t, "flush "+setClusterIP, f.netlinkBehindTheBack(t).IpsetFlush(setClusterIP))
	}},
	{name: "ipset-destroyed", diverges: "anomaly: ipsets missing: WEIR-IPVS-CLUSTER-IP", do: func(t *testing.T, f *repairFixture) {
		f.iptables(t, 4, "-t", "nat", "-F", chainServices) // the only rules using it
		must(t, "destroy "+setClusterIP, f.netlinkBehindTheBack(t).IpsetDestroy(setClusterIP))
	}},
	{name: "ipset-recreated-with-another-type", diverges: "anomaly: ipsets that are not what Weir creates: WEIR-IPVS-CLUSTER-IP: type hash:ip, want hash:ip,port", do: func(t *testing.T, f *repairFixture) {
		f.iptables(t, 4, "-t", "nat", "-F", chainServices)
		h := f.netlinkBehindTheBack(t)
		must(t, "destroy "+setClusterIP, h.IpsetDestroy(setClusterIP))
		must(t, "create "+setClusterIP, h.IpsetCreate(setClusterIP, "hash:ip", netlink.IpsetCreateOptions{}))
	}},
	{name: "iptables-chain", diverges: "anomaly: IPv4 nat chain WEIR-IPVS-SERVICES is missing", do: func(t *testing.T, f *repairFixture) {
		for _, from := range []string{"PREROUTING", "OUTPUT"} {
			f.iptables(t, 4, "-t", "nat", "-D", from, "-m", "comment", "--comment", "weir IPVS service masquerading", "-j", chainServices)
		}
		f.iptables(t, 4, "-t", "nat", "-F", chainServices)
		f.iptables(t, 4, "-t", "nat", "-X", chainServices)
	}},
	{name: "iptables-jump", diverges: "anomaly: IPv4 nat chain POSTROUTING does not jump to WEIR-IPVS-POSTROUTING", do: func(t *testing.T, f *repairFixture) {
		f.iptables(t, 4, "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "weir IPVS masquerading", "-j", chainPostrouting)
	}},
	{name: "real-server-not-nat", diverges: webCluster + ": endpoints: want 10.244.0.11:8080*1 10.244.0.12:8080*1, got 10.244.0.12:8080*1", do: func(t *testing.T, f *repairFixture) {
		d := toDestination(netip.AddrPortFrom(podA, podPort), 1)
		d.ConnectionFlags = ipvs.ConnectionFlagDirectRoute
		must(t, "switch pod-a to direct routing", f.ipvsBehindTheBack(t).UpdateDestination(toService(webVS, nil), d))
	}},
}

// webCluster names web's cluster IP destination in a divergence.
const webCluster = "default/web:p/TCP (cluster IP 10.96.0.10:80/TCP)"

// damaged applies d and checks that the read-back names it.
func (f *repairFixture) damaged(t *testing.T, d damage) {
	t.Helper()
	d.do(t, f)
	if got := f.divergences(t); !strings.Contains(got, d.diverges) {
		t.Errorf("after the damage the read-back shows\n%s\nwant a line with %q", got, d.diverges)
	}
}

// TestKernelRepairAfterFullSync removes each object and runs a full sync
// (the periodic one): it succeeds and every connection works again.
func TestKernelRepairAfterFullSync(t *testing.T) {
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			f := newRepairFixture(t, FlavourNFT)
			f.damaged(t, d)
			f.addPodC()
			if err := f.b.Sync(context.Background(), f.p, backends.FullSync()); err != nil {
				t.Fatalf("full sync after the damage: %v", err)
			}
			f.check(t, "after a full sync", "pod-a", "pod-b", "pod-c")
		})
	}
}

// TestKernelRepairAfterPartialSync removes each object and changes web in
// a partial sync: it succeeds, rebuilding at once when it ran into the
// damage; what it could not see, the next full sync repairs.
func TestKernelRepairAfterPartialSync(t *testing.T) {
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			f := newRepairFixture(t, FlavourNFT)
			f.damaged(t, d)
			f.addPodC()
			if err := f.b.Sync(context.Background(), f.p, backends.PartialSync(f.web.Key)); err != nil {
				t.Fatalf("partial sync after the damage: %v", err)
			}
			if d.partialRepairs {
				f.checkWeb(t, "after a partial sync", "pod-a", "pod-b", "pod-c")
			}
			mustSync(t, f.b, f.p, backends.FullSync())
			f.check(t, "after the next full sync", "pod-a", "pod-b", "pod-c")
		})
	}
}

// TestKernelRepairIPTablesLegacy repeats the iptables removals with
// iptables-legacy.
func TestKernelRepairIPTablesLegacy(t *testing.T) {
	for _, d := range damages {
		if d.name != "iptables-chain" && d.name != "iptables-jump" && d.name != "ipset-destroyed" {
			continue
		}
		t.Run(d.name, func(t *testing.T) {
			f := newRepairFixture(t, FlavourLegacy)
			f.damaged(t, d)
			f.addPodC()
			mustSync(t, f.b, f.p, backends.FullSync())
			f.check(t, "after a full sync", "pod-a", "pod-b", "pod-c")
		})
	}
}

// TestKernelXtablesLockHeld holds the xtables lock, as another program
// would, while an iptables-legacy backend syncs: the sync gives up within
// the bounded waits (one restore per family, no rebuild after) with a
// LockError, and the sync after the lock is released succeeds.
func TestKernelXtablesLockHeld(t *testing.T) {
	topo, b := newCluster(t, Options{Flavour: FlavourLegacy})
	web := service("web", plan.TCP, 80, 0, []string{vip.String()}, podEP(podA, 1))
	p := testPlan(web)
	mustSync(t, b, p, backends.FullSync())

	fd, err := unix.Open(xtables.LockFile(), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	must(t, "take the xtables lock", unix.Flock(fd, unix.LOCK_EX))
	var release sync.Once
	unlock := func() { release.Do(func() { must(t, "release the xtables lock", unix.Flock(fd, unix.LOCK_UN)) }) }
	// Should the sync wait for the lock without a bound, this releases it
	// and the test fails on the time taken instead of hanging.
	safety := time.AfterFunc(40*time.Second, unlock)
	defer safety.Stop()
	start := time.Now()
	err = b.Sync(context.Background(), p, backends.FullSync())
	took := time.Since(start)
	unlock()
	var locked *xtables.LockError
	if !errors.As(err, &locked) {
		t.Errorf("sync with the lock held: %v, want a LockError", err)
	}
	if bound := 3 * xtables.LockWait; took > bound {
		t.Errorf("sync with the lock held took %s, want under %s (two bounded waits, no rebuild)", took.Round(time.Millisecond), bound)
	}
	t.Logf("sync with the lock held failed after %s: %v", took.Round(time.Millisecond), err)
	mustSync(t, b, p, backends.FullSync())
	netns.WantPods(t, "after the lock is released", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 3), "pod-a")
}
