package iptables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Kernel tests: a real node namespace programmed by the backend with each
// iptables flavour, pods that answer with their name, and real connections.

// The pods of netns.ThreePods, which ktTopology builds.
var (
	ktPodA, ktPodB, ktPodC = netns.PodA, netns.PodB, netns.PodC
	ktPodA6, ktPodB6       = netns.PodA6, netns.PodB6
)

var (
	ktVIP  = netip.MustParseAddr("10.96.0.10")
	ktVIP2 = netip.MustParseAddr("10.96.0.11")
	ktVIP6 = netip.MustParseAddr("fd00:10:96::10")
)

const ktPort = netns.PodPort

// eachFlavour runs fn as a parallel subtest per flavour.
func eachFlavour(t *testing.T, fn func(t *testing.T, fl string)) {
	for _, fl := range []string{flavourLegacy, flavourNFT} {
		t.Run(fl, func(t *testing.T) {
			t.Parallel()
			fn(t, fl)
		})
	}
}

// ktTopology builds the three pods of netns.ThreePods, pod-a and pod-b
// dual-stack.
func ktTopology(t *testing.T) *netns.Topology {
	t.Helper()
	return netns.NewThreePods(t, netns.DualStack("pod-a", "pod-b"))
}

// ktBackend creates a backend of flavour fl for the topology's node.
func ktBackend(t *testing.T, topo *netns.Topology, fl string) *Backend {
	t.Helper()
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd()}, Flavour: fl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// ktService is a TCP service on vip:80 balancing over pods on ktPort.
func ktService(name string, vip netip.Addr, pods ...netip.Addr) *plan.Service {
	s := &plan.Service{
		Key:        plan.Key{Namespace: "default", Name: name, Port: "http", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{vip},
		Port:       80,
	}
	for _, a := range pods {
		s.Endpoints = append(s.Endpoints, plan.Endpoint{Address: a, Port: ktPort, Ready: true, Serving: true, ForCluster: true, Weight: 1})
	}
	return s
}

func ktPlan(svcs ...*plan.Service) *plan.Plan {
	p := &plan.Plan{Node: plan.Node{Name: "node-a"}, Services: map[plan.Key]*plan.Service{}}
	for _, s := range svcs {
		p.Services[s.Key] = s
	}
	return p
}

func ktSync(t *testing.T, b *Backend, p *plan.Plan, req backends.SyncRequest) {
	t.Helper()
	if err := b.Sync(context.Background(), p, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// ktUnanswered checks that no pod answers addr from ns.
func ktUnanswered(t *testing.T, what string, ns *netns.Namespace, addr netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if a, err := ns.DialTCP(ctx, addr); err == nil {
		t.Errorf("%s: %s answered %s; want no pod", what, a.Pod, addr)
	}
}

// ktSave returns table of family f in the node namespace, as iptables-save
// of the backend's flavour prints it.
func ktSave(t *testing.T, topo *netns.Topology, fl *flavour, f ipFamily, table string) string {
	t.Helper()
	out, err := runSave(context.Background(), topo.Node.Fd(), fl.tools(f).save, table)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// ktRestore writes text with the flavour's iptables-restore of family f.
func ktRestore(t *testing.T, topo *netns.Topology, fl *flavour, f ipFamily, text string) {
	t.Helper()
	if err := runRestore(context.Background(), topo.Node.Fd(), fl.tools(f).restore, []byte(text)); err != nil {
		t.Fatal(err)
	}
}

// injectBadRule returns a rewrite hook that adds a rule iptables-restore
// rejects to the IPv4 nat text.
func injectBadRule(f ipFamily, text []byte) []byte {
	if f != ipv4 || tableOf(text) != tableNAT {
		return text
	}
	i := bytes.LastIndex(text, []byte("COMMIT"))
	return slices.Concat(text[:i], []byte("-A KUBE-SERVICES -m weir-no-such-match -j ACCEPT\n"), text[i:])
}

// TestKernelFailedRestoreKeepsRules makes the nat restore of a partial and
// then of a full sync fail (the full sync's filter restore, run first,
// succeeds): the previous translations keep serving real connections, and
// the next sync, although asked for as partial, is full and recovers.
func TestKernelFailedRestoreKeepsRules(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		web := ktService("web", ktVIP, ktPodA)
		p := ktPlan(web)
		ktSync(t, b, p, backends.FullSync())
		addr := netip.AddrPortFrom(ktVIP, 80)
		netns.WantPods(t, "before", netns.DialMany(t, topo.Client, addr, 5), "pod-a")

		b.rewrite = injectBadRule
		p.Services[web.Key] = ktService("web", ktVIP, ktPodB)
		err := b.Sync(context.Background(), p, backends.PartialSync(web.Key))
		if err == nil {
			t.Fatal("partial sync with a bad rule succeeded")
		}
		if !strings.Contains(err.Error(), `"-A KUBE-SERVICES -m weir-no-such-match -j ACCEPT"`) {
			t.Errorf("error %q does not quote the failing input line", err)
		}
		netns.WantPods(t, "after the failed partial sync", netns.DialMany(t, topo.Client, addr, 5), "pod-a")

		other := ktService("other", ktVIP2, ktPodC)
		p.Services[other.Key] = other
		if err := b.Sync(context.Background(), p, backends.FullSync()); err == nil {
			t.Fatal("full sync with a bad rule succeeded")
		}
		netns.WantPods(t, "after the failed full sync", netns.DialMany(t, topo.Client, addr, 5), "pod-a")
		ktUnanswered(t, "service added by the failed full sync", topo.Client, netip.AddrPortFrom(ktVIP2, 80))

		b.rewrite = nil
		// Only web is named as changed; other appearing proves the sync was full.
		ktSync(t, b, p, backends.PartialSync(web.Key))
		netns.WantPods(t, "after recovery", netns.DialMany(t, topo.Client, addr, 5), "pod-b")
		netns.WantPods(t, "service added during the failures", netns.DialMany(t, topo.Client, netip.AddrPortFrom(ktVIP2, 80), 5), "pod-c")

		// Back to partial syncs.
		p.Services[web.Key] = ktService("web", ktVIP, ktPodA, ktPodB)
		ktSync(t, b, p, backends.PartialSync(web.Key))
		netns.WantPods(t, "partial sync after recovery", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-b")
	})
}

// kubeProxyState is what kube-proxy in iptables mode leaves behind for one
// service 10.96.0.10:80 → pod-c and one without endpoints (10.96.0.12),
// plus kubelet's chains and a chain of someone else that must survive.
// The same chains also exist for IPv6 (kubeProxyState6).
const kubeProxyState = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-TAKEOVERTESTAAAAA - [0:0]
:KUBE-SEP-TAKEOVERTESTBBBBB - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KEEP-ME - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j KEEP-ME
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals (an older kube-proxy)" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-TAKEOVERTESTAAAAA
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-TAKEOVERTESTAAAAA -j KUBE-SEP-TAKEOVERTESTBBBBB
-A KUBE-SEP-TAKEOVERTESTBBBBB -p tcp -m tcp -j DNAT --to-destination 10.244.0.13:8080
-A KEEP-ME -j RETURN
COMMIT
*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP
COMMIT
`

// kubeProxyState6 is kube-proxy's IPv6 leftover: one service
// [fd00:10:96::10]:80 → pod-b.
const kubeProxyState6 = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TAKEOVERTESTCCCCC - [0:0]
:KUBE-SEP-TAKEOVERTESTDDDDD - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:10:96::10/128 -p tcp -m tcp --dport 80 -j KUBE-SVC-TAKEOVERTESTCCCCC
-A KUBE-SVC-TAKEOVERTESTCCCCC -j KUBE-SEP-TAKEOVERTESTDDDDD
-A KUBE-SEP-TAKEOVERTESTDDDDD -p tcp -m tcp -j DNAT --to-destination [fd00:10:244::12]:8080
COMMIT
`

// TestKernelTakeoverAndCleanup starts the backend, with flavour "auto", on
// a node where kube-proxy ran in iptables mode: it must pick kube-proxy's
// flavour, take the chains over (traffic follows Weir's plan, kube-proxy's
// orphan service chains and reject are gone, jump rules not doubled), and
// its Cleanup must remove every chain and jump of Weir's in both families
// and tables, stopping the traffic, and leave other chains alone.
func TestKernelTakeoverAndCleanup(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		want, err := lookupFlavour(fl)
		if err != nil {
			t.Fatal(err)
		}
		ktRestore(t, topo, want, ipv4, kubeProxyState)
		ktRestore(t, topo, want, ipv6, kubeProxyState6)
		addr, addr6 := netip.AddrPortFrom(ktVIP, 80), netip.AddrPortFrom(ktVIP6, 80)
		netns.WantPods(t, "kube-proxy's rules", netns.DialMany(t, topo.Client, addr, 3), "pod-c")
		netns.WantPods(t, "kube-proxy's IPv6 rules", netns.DialMany(t, topo.Client, addr6, 3), "pod-b")

		b := ktBackend(t, topo, "auto")
		if b.Flavour() != fl {
			t.Fatalf("auto detection chose %s on a node with %s rules", b.Flavour(), fl)
		}
		web := ktService("web", ktVIP, ktPodA, ktPodB)
		web.ClusterIPs = append(web.ClusterIPs, ktVIP6)
		web.Endpoints = append(web.Endpoints,
			plan.Endpoint{Address: ktPodA6, Port: ktPort, Ready: true, Serving: true, ForCluster: true, Weight: 1})
		ktSync(t, b, ktPlan(web), backends.FullSync())

		netns.WantPods(t, "after takeover", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-b")
		netns.WantPods(t, "IPv6 after takeover", netns.DialMany(t, topo.Client, addr6, 5), "pod-a")
		nat, filter := ktSave(t, topo, want, ipv4, tableNAT), ktSave(t, topo, want, ipv4, tableFilter)
		nat6 := ktSave(t, topo, want, ipv6, tableNAT)
		for _, gone := range []string{"KUBE-SVC-TAKEOVERTESTAAAAA", "KUBE-SEP-TAKEOVERTESTBBBBB", "10.96.0.12"} {
			if strings.Contains(nat+filter, gone) {
				t.Errorf("after takeover, %s is still in the IPv4 tables", gone)
			}
		}
		if strings.Contains(nat6, "TAKEOVERTEST") {
			t.Errorf("after takeover, kube-proxy's IPv6 service chains are still there:\n%s", nat6)
		}
		jump := `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
		if n := strings.Count(nat, jump+"\n"); n != 1 {
			t.Errorf("after takeover, nat PREROUTING jumps to KUBE-SERVICES %d times, want once:\n%s", n, nat)
		}

		if err := b.Cleanup(context.Background()); err != nil {
			t.Fatalf("cleanup: %v", err)
		}
		ktWantClean(t, topo, want)
		ktUnanswered(t, "after cleanup", topo.Client, addr)
		ktUnanswered(t, "IPv6 after cleanup", topo.Client, addr6)
		if err := b.Cleanup(context.Background()); err != nil {
			t.Errorf("second cleanup: %v", err)
		}

		// Weir can come back after its cleanup.
		ktSync(t, b, ktPlan(web), backends.FullSync())
		netns.WantPods(t, "synced again after cleanup", netns.DialMany(t, topo.Client, addr, 40), "pod-a", "pod-b")
	})
}

// ktWantClean checks that no chain of Weir's and no rule jumping into one
// is left in either family's nat and filter, and that kubelet's and other
// chains and their rules are.
func ktWantClean(t *testing.T, topo *netns.Topology, fl *flavour) {
	t.Helper()
	var all strings.Builder
	for _, f := range []ipFamily{ipv4, ipv6} {
		for _, table := range []string{tableNAT, tableFilter} {
			save := ktSave(t, topo, fl, f, table)
			all.WriteString(save)
			for line := range strings.Lines(save) {
				args := splitRule(strings.TrimSpace(line))
				if len(args) == 0 {
					continue
				}
				if c, ok := strings.CutPrefix(args[0], ":"); ok && ownedChain(c) {
					t.Errorf("IPv%d %s: chain %s left after cleanup", f, table, c)
				}
				if args[0] == "-A" && ownedChain(ruleTarget(args)) {
					t.Errorf("IPv%d %s: rule left after cleanup: %s", f, table, strings.TrimSpace(line))
				}
			}
		}
	}
	for _, kept := range []string{":KEEP-ME", "-A PREROUTING -j KEEP-ME", ":KUBE-KUBELET-CANARY",
		"-A INPUT -j KUBE-FIREWALL", "-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP"} {
		if !strings.Contains(all.String(), kept) {
			t.Errorf("cleanup removed %q, which is not Weir's", kept)
		}
	}
}

// TestKernelCleanupOfNothing cleans a namespace where nothing ran.
func TestKernelCleanupOfNothing(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := netns.NewT(t, netns.Options{})
		b := ktBackend(t, topo, fl)
		if err := b.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup of an empty namespace: %v", err)
		}
	})
}

// TestKernelLocalhostNodePort sets route_localnet through the namespace and
// reaches a node port on 127.0.0.1 from the node.
func TestKernelLocalhostNodePort(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), LocalhostNodePorts: true}, Flavour: fl})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		web := ktService("web", ktVIP, ktPodA, ktPodB)
		web.NodePort = 30080
		ktSync(t, b, ktPlan(web), backends.FullSync())
		answers := netns.DialMany(t, topo.Node, netip.MustParseAddrPort("127.0.0.1:30080"), 20)
		netns.WantPods(t, "NodePort on 127.0.0.1 from the node", answers, "pod-a", "pod-b")
		if src := answers[0].Source.Addr(); src.IsLoopback() {
			t.Errorf("pod saw the loopback source %s; want it masqueraded", src)
		}
	})
}

// TestKernelOneChangeWritesOneService checks, on the restore texts the
// backend runs, that a one-endpoint change among many services writes that
// service's chains and no other service's.
func TestKernelOneChangeWritesOneService(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		p := ktPlan()
		var keys []plan.Key
		for i := range 50 {
			s := ktService(fmt.Sprintf("svc-%02d", i), netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), ktPodA, ktPodB)
			p.Services[s.Key] = s
			keys = append(keys, s.Key)
		}
		ktSync(t, b, p, backends.FullSync())
		var texts [][]byte
		b.rewrite = func(f ipFamily, text []byte) []byte {
			texts = append(texts, text)
			return text
		}
		p.Services[keys[17]] = ktService("svc-17", netip.AddrFrom4([4]byte{10, 96, 1, 17}), ktPodA, ktPodC)
		ktSync(t, b, p, backends.PartialSync(keys[17]))
		all := string(bytes.Join(texts, nil))
		if strings.Contains(all, "10.96.1.18") || strings.Contains(all, "10.96.1.16") {
			t.Errorf("the partial restore mentions a neighbour service:\n%s", all)
		}
		if !strings.Contains(all, "10.244.0.13") {
			t.Errorf("the partial restore does not add pod-c:\n%s", all)
		}
		netns.WantPods(t, "changed service", netns.DialMany(t, topo.Client, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, 17}), 80), 40), "pod-a", "pod-c")
		netns.WantPods(t, "untouched neighbour", netns.DialMany(t, topo.Client, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, 18}), 80), 40), "pod-a", "pod-b")
	})
}

// TestKernelFullSyncRestoresJumps deletes jump rules from the built-in
// chains behind the backend's back: traffic stops, and the next full sync
// puts each back exactly once. The look at the tables, which decides
// whether a jump is missing, must see all of them while all are in place.
func TestKernelFullSyncRestoresJumps(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		p := ktPlan(ktService("web", ktVIP, ktPodA))
		ktSync(t, b, p, backends.FullSync())
		addr := netip.AddrPortFrom(ktVIP, 80)
		netns.WantPods(t, "after the first sync", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
		for _, f := range []ipFamily{ipv4, ipv6} {
			look, err := b.lookFamily(context.Background(), f)
			if err != nil {
				t.Fatal(err)
			}
			if missing := missingJumps(look); len(missing) > 0 {
				t.Fatalf("with every jump in place, the look at IPv%d misses %v", f, missing)
			}
		}
		ktRestore(t, topo, b.fl, ipv4, "*nat\n"+
			`-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`+"\nCOMMIT\n"+
			"*filter\n"+`-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`+"\nCOMMIT\n")
		ktUnanswered(t, "without the PREROUTING jump", topo.Client, addr)

		ktSync(t, b, p, backends.FullSync())
		netns.WantPods(t, "after the full sync", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
		nat, filter := ktSave(t, topo, b.fl, ipv4, tableNAT), ktSave(t, topo, b.fl, ipv4, tableFilter)
		for _, j := range jumps {
			rule := "-A " + j.from + " " + strings.Join(quoteArgs(j.spec()), " ") + "\n"
			in := nat
			if j.table == tableFilter {
				in = filter
			}
			if n := strings.Count(in, rule); n != 1 {
				t.Errorf("after the full sync, %s %s jumps to %s %d times, want once", j.table, j.from, j.to, n)
			}
		}
	})
}

// TestKernelNFTListsFirst checks that every iptables-nft nat restore that
// rewrites everything (a full sync, a partial one new podCIDRs widen)
// starts with -S and other partial ones do not; and that when
// iptables-restore dies of a signal with the listing (a stand-in script
// here), the sync retries without it and succeeds.
func TestKernelNFTListsFirst(t *testing.T) {
	topo := ktTopology(t)
	// Every full sync rewrites: none reconciles.
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd(), LocalDetector: backends.DetectNodeCIDR},
		Flavour: flavourNFT, RewritePeriod: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	var listed []bool
	b.rewrite = func(f ipFamily, text []byte) []byte {
		if f == ipv4 && tableOf(text) == tableNAT {
			listed = append(listed, bytes.HasPrefix(text, []byte("*nat\n"+listLine)))
		}
		return text
	}
	crashing := filepath.Join(t.TempDir(), "crashing-restore")
	script := "#!/bin/sh\nin=$(cat)\n" +
		`[ "$(printf '%s\n' "$in" | sed -n 2p)" = "-S" ] && kill -SEGV $$` + "\n" +
		`printf '%s\n' "$in" | exec ` + b.fams[0].tools.restore + ` "$@"` + "\n"
	if err := os.WriteFile(crashing, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b.fams[0].tools.restore = crashing
	web := ktService("web", ktVIP, ktPodA)
	ktSync(t, b, ktPlan(web), backends.FullSync())
	addr := netip.AddrPortFrom(ktVIP, 80)
	netns.WantPods(t, "after a full sync retried without -S", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
	web = ktService("web", ktVIP, ktPodB)
	ktSync(t, b, ktPlan(web), backends.PartialSync(web.Key))
	netns.WantPods(t, "after a partial sync", netns.DialMany(t, topo.Client, addr, 3), "pod-b")
	ktSync(t, b, ktPlan(web), backends.FullSync())
	// New podCIDRs change every service's rules: a partial sync renders all.
	p := ktPlan(web)
	p.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	ktSync(t, b, p, backends.PartialSync())
	if !slices.Equal(listed, []bool{true, false, true, true}) {
		t.Errorf("nat restores starting with -S: %v, want [true false true true] (renders of everything only)", listed)
	}
}

// TestKernelReconcile checks full syncs asked for within RewritePeriod of
// the last rewrite: with nothing changed they run no restore; a changed
// service has only its chains written, a removed one its chains deleted;
// a jump rule deleted behind the backend's back makes the next one
// rewrite everything (and put the jump back).
func TestKernelReconcile(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		var texts []string
		b.rewrite = func(f ipFamily, text []byte) []byte {
			if f == ipv4 && hasRules(text) {
				texts = append(texts, string(text))
			}
			return text
		}
		web, api := ktService("web", ktVIP, ktPodA), ktService("api", ktVIP2, ktPodB)
		p := ktPlan(web, api)
		ktSync(t, b, p, backends.FullSync())
		addr := netip.AddrPortFrom(ktVIP, 80)
		netns.WantPods(t, "after the first sync", netns.DialMany(t, topo.Client, addr, 3), "pod-a")
		apiChains := chainsFor(servicePortName(api.Key), "tcp")

		texts = nil
		ktSync(t, b, p, backends.FullSync())
		if len(texts) != 0 {
			t.Errorf("a full sync of an unchanged plan ran restores:\n%s", strings.Join(texts, "\n"))
		}

		web = ktService("web", ktVIP, ktPodC)
		p = ktPlan(web)
		texts = nil
		ktSync(t, b, p, backends.FullSync())
		netns.WantPods(t, "after web changed and api left", netns.DialMany(t, topo.Client, addr, 3), "pod-c")
		all := strings.Join(texts, "")
		if strings.Contains(all, ":"+kubeServices+" ") || !strings.Contains(all, "-X "+apiChains.svc) {
			t.Errorf("reconcile rewrote fixed chains or kept api's chains:\n%s", all)
		}
		if nat := ktSave(t, topo, b.fl, ipv4, tableNAT); strings.Contains(nat, apiChains.svc) {
			t.Errorf("api's chain %s is still in the kernel", apiChains.svc)
		}

		ktRestore(t, topo, b.fl, ipv4, "*nat\n"+
			`-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`+"\nCOMMIT\n")
		texts = nil
		ktSync(t, b, p, backends.FullSync())
		if all := strings.Join(texts, ""); !strings.Contains(all, ":"+kubeServices+" ") {
			t.Errorf("a full sync after a jump went missing did not rewrite everything:\n%s", all)
		}
		netns.WantPods(t, "after the rewrite", netns.DialMany(t, topo.Client, addr, 3), "pod-c")
	})
}
