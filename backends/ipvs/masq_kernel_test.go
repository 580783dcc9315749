//go:build vm

package ipvs

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

var (
	flavours = []string{FlavourNFT, FlavourLegacy}
	selfVIP  = netip.MustParseAddr("10.96.0.20")
)

// sourceSeen dials addr once from ns and returns the source the pod saw.
func sourceSeen(t *testing.T, ns *netns.Namespace, addr netip.AddrPort) netip.Addr {
	t.Helper()
	return netns.DialMany(t, ns, addr, 1)[0].Source.Addr()
}

func wantSource(t *testing.T, what string, got, want netip.Addr) {
	t.Helper()
	if got != want {
		t.Errorf("%s: pod saw %s, want %s", what, got, want)
	}
}

// masqPlan has web (cluster IP, node port 30080, pod-b) and self (pod-a
// only, for hairpin).
func masqPlan() *plan.Plan {
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podB, 1))
	self := service("self", plan.TCP, 80, 0, []string{selfVIP.String()}, podEP(podA, 1))
	return testPlan(web, self)
}

func TestKernelMasqueradeByClusterCIDRs(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl, func(t *testing.T) {
			opts := Options{Flavour: fl}
			opts.ClusterCIDRs = []netip.Prefix{netns.DefaultPodCIDR}
			topo, b := newCluster(t, opts)
			mustSync(t, b, masqPlan(), backends.FullSync())
			podANS := topo.Pods["pod-a"].NS
			wantSource(t, "client → cluster IP", sourceSeen(t, topo.Client, netip.AddrPortFrom(vip, 80)), topo.NodeIP)
			wantSource(t, "pod-a → cluster IP", sourceSeen(t, podANS, netip.AddrPortFrom(vip, 80)), podA)
			wantSource(t, "client → node port", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080)), topo.NodeIP)
			for _, a := range netns.DialMany(t, podANS, netip.AddrPortFrom(selfVIP, 80), 3) {
				if a.Pod != "pod-a" || a.Source.Addr() != topo.NodeIP {
					t.Errorf("hairpin pod-a → VIP → pod-a: got %s, want pod-a seeing %s", a, topo.NodeIP)
				}
			}
		})
	}
}

func TestKernelMasqueradeAll(t *testing.T) {
	opts := Options{}
	opts.MasqueradeAll = true
	topo, b := newCluster(t, opts)
	mustSync(t, b, masqPlan(), backends.FullSync())
	wantSource(t, "pod-a → cluster IP", sourceSeen(t, topo.Pods["pod-a"].NS, netip.AddrPortFrom(vip, 80)), topo.NodeIP)
}

func TestKernelNoDetectorKeepsClusterIPSources(t *testing.T) {
	topo, b := newCluster(t, Options{})
	mustSync(t, b, masqPlan(), backends.FullSync())
	wantSource(t, "client → cluster IP", sourceSeen(t, topo.Client, netip.AddrPortFrom(vip, 80)), topo.ClientIP)
	wantSource(t, "client → node port", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080)), topo.NodeIP)
}

func TestKernelExternalTrafficPolicyLocalKeepsClientSource(t *testing.T) {
	topo, b := newCluster(t, Options{})
	local := service("local", plan.TCP, 80, 30081, []string{"10.96.0.21"}, localEP(podB.String(), podPort))
	local.ExternalLocal = true
	p := masqPlan()
	p.Services[local.Key] = local
	mustSync(t, b, p, backends.FullSync())
	wantSource(t, "client → ETP Local node port", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30081)), topo.ClientIP)
	wantSource(t, "client → ETP Cluster node port", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080)), topo.NodeIP)
}

// A partial sync updates the sets without a full sync: a service added
// and one turned ETP Local are masqueraded as their new state says.
func TestKernelMasqueradePartialSync(t *testing.T) {
	topo, b := newCluster(t, Options{Common: backends.Common{ClusterCIDRs: []netip.Prefix{netns.DefaultPodCIDR}}})
	mustSync(t, b, testPlan(), backends.FullSync())
	p := masqPlan()
	mustSync(t, b, p, backends.PartialSync(p.Keys()...))
	wantSource(t, "client → cluster IP after a partial sync", sourceSeen(t, topo.Client, netip.AddrPortFrom(vip, 80)), topo.NodeIP)
	wantSource(t, "client → node port after a partial sync", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080)), topo.NodeIP)

	web := p.Services[service("web", plan.TCP, 0, 0, nil).Key]
	web.ExternalLocal = true
	web.Endpoints = []plan.Endpoint{localEP(podB.String(), podPort)}
	mustSync(t, b, p, backends.PartialSync(web.Key))
	wantSource(t, "client → node port turned ETP Local", sourceSeen(t, topo.Client, netip.AddrPortFrom(topo.NodeIP, 30080)), topo.ClientIP)
	b.mu.Lock()
	res, err := b.nl.IpsetList(setExternalLocal)
	b.mu.Unlock()
	if err != nil || len(res.Entries) != 1 {
		t.Fatalf("%s after the partial sync: %v, %v", setExternalLocal, res, err)
	}
}

func TestKernelMasqueradeCleanup(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl, func(t *testing.T) {
			topo, b := newCluster(t, Options{Flavour: fl})
			mustSync(t, b, masqPlan(), backends.FullSync())
			mustSync(t, b, masqPlan(), backends.FullSync()) // a second full sync adds no second jump
			if n := strings.Count(iptablesSave(t, topo, fl), "-j WEIR-IPVS-SERVICES"); n != 4 {
				t.Errorf("after two full syncs: %d jumps to WEIR-IPVS-SERVICES, want 4 (PREROUTING and OUTPUT, both families)", n)
			}
			if err := b.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
			if save := iptablesSave(t, topo, fl); strings.Contains(save, "WEIR-IPVS") {
				t.Errorf("after Cleanup iptables still has:\n%s", save)
			}
			for _, s := range allSets() {
				if _, err := b.nl.IpsetList(s.name); err == nil {
					t.Errorf("after Cleanup ipset %s is still there", s.name)
				}
			}
		})
	}
}

// iptablesSave returns the nat table of both families with flavour fl.
func iptablesSave(t *testing.T, topo *netns.Topology, fl string) string {
	t.Helper()
	var out strings.Builder
	for _, bin := range []string{"iptables-" + fl + "-save", "ip6tables-" + fl + "-save"} {
		err := topo.Node.Do(func() error {
			b, err := exec.Command("/usr/sbin/"+bin, "-t", "nat").CombinedOutput()
			out.Write(b)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v: %s", bin, err, out.String())
		}
	}
	return out.String()
}
