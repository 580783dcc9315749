package iptables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Kernel tests of repair: an operator or another tool removes Weir's rules
// by hand, and the backend must converge again, at the next periodic full
// sync and, where the partial sync touches what was removed, at once.

// repairPlan is what the repair tests serve: web, a dual-stack cluster IP
// over pod-a and pod-b; np, a node port 30080 over pod-c; none, a cluster
// IP without endpoints (rejected).
func repairPlan() *plan.Plan {
	web := ktService("web", ktVIP, ktPodA, ktPodB)
	web.ClusterIPs = append(web.ClusterIPs, ktVIP6)
	for _, a := range []netip.Addr{ktPodA6, ktPodB6} {
		web.Endpoints = append(web.Endpoints, plan.Endpoint{Address: a, Port: ktPort, Ready: true, Serving: true, ForCluster: true, Weight: 1})
	}
	np := ktService("np", ktVIP2, ktPodC)
	np.NodePort = 30080
	none := ktService("none", netip.MustParseAddr("10.96.0.12"))
	return ktPlan(web, np, none)
}

// repairKey returns the key of one of repairPlan's services.
func repairKey(name string) plan.Key {
	return plan.Key{Namespace: "default", Name: name, Port: "http", Protocol: plan.TCP}
}

// repairChange changes the named service of p the way a partial sync after
// the tampering carries: web and np gain an endpoint, none gets one.
func repairChange(p *plan.Plan, name string) {
	k := repairKey(name)
	s := p.Services[k].Clone()
	switch name {
	case "web":
		s.Endpoints = append(s.Endpoints, ktService("x", ktVIP, ktPodC).Endpoints...)
	case "np", "none":
		s.Endpoints = append(s.Endpoints, ktService("x", ktVIP, ktPodB).Endpoints...)
	}
	p.Services[k] = s
}

// wantServing checks with real connections that every service of p
// answers as p says: from the client, web over IPv4 and IPv6, np at the
// node's address, and none refused at once.
func wantServing(t *testing.T, topo *netns.Topology, p *plan.Plan, what string) {
	t.Helper()
	for _, name := range []string{"web", "np"} {
		s := p.Services[repairKey(name)]
		var pods []string
		for _, e := range s.Endpoints {
			if e.Address.Is4() {
				pods = append(pods, ktPodName(e.Address))
			}
		}
		addr := netip.AddrPortFrom(s.ClusterIPs[0], s.Port)
		if s.NodePort != 0 {
			addr = netip.AddrPortFrom(topo.NodeIP, s.NodePort)
		}
		netns.WantPods(t, what+": "+name, netns.DialMany(t, topo.Client, addr, 12*len(pods)), pods...)
	}
	web6 := netip.AddrPortFrom(ktVIP6, 80)
	netns.WantPods(t, what+": web over IPv6", netns.DialMany(t, topo.Client, web6, 24), "pod-a", "pod-b")
	none := p.Services[repairKey("none")]
	addr := netip.AddrPortFrom(none.ClusterIPs[0], none.Port)
	if len(none.Endpoints) > 0 {
		netns.WantPods(t, what+": none", netns.DialMany(t, topo.Client, addr, 3), "pod-b")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if a, err := topo.Client.DialTCP(ctx, addr); !errors.Is(err, netns.ErrRefused) {
		t.Errorf("%s: none (no endpoints) at %s: answer %v, error %v; want refused at once", what, addr, a, err)
	}
}

// ktPodName names the pod of a test address.
func ktPodName(a netip.Addr) string {
	switch a {
	case ktPodA, ktPodA6:
		return "pod-a"
	case ktPodB, ktPodB6:
		return "pod-b"
	}
	return "pod-c"
}

// hand runs an operator's commands in the node namespace with the
// backend's flavour.
type hand struct {
	t    *testing.T
	topo *netns.Topology
	fl   *flavour
}

// ipt runs the flavour's iptables (or ip6tables) with args.
func (h hand) ipt(f ipFamily, args ...string) {
	h.t.Helper()
	bin := h.fl.tools(f).iptables
	if _, stderr, err := runTool(context.Background(), h.topo.Node.Fd(), nil, bin, append([]string{"-w"}, args...)...); err != nil {
		h.t.Fatalf("%s %s: %v: %s", bin, strings.Join(args, " "), err, stderr)
	}
}

// removeChain deletes every rule of table that jumps to chain, then flushes
// and deletes chain, as an operator removing one chain must.
func (h hand) removeChain(f ipFamily, table, chain string) {
	h.t.Helper()
	for line := range strings.Lines(ktSave(h.t, h.topo, h.fl, f, table)) {
		args := splitRule(strings.TrimSpace(line))
		if len(args) > 2 && args[0] == "-A" && args[1] != chain && ruleTarget(args) == chain {
			h.ipt(f, append([]string{"-t", table, "-D"}, args[1:]...)...)
		}
	}
	h.ipt(f, "-t", table, "-F", chain)
	h.ipt(f, "-t", table, "-X", chain)
}

// flushRuleset does what `nft flush ruleset` does: delete every nftables
// table of the namespace, iptables-nft's among them.
func (h hand) flushRuleset() {
	h.t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(h.topo.Node.Fd()))
	if err != nil {
		h.t.Fatal(err)
	}
	c.FlushRuleset()
	if err := errors.Join(c.Flush(), c.CloseLasting()); err != nil {
		h.t.Fatalf("flush the ruleset: %v", err)
	}
	if err := c.Flush(); err != nil {
		h.t.Fatalf("flush ruleset: %v", err)
	}
}

// webChains are the chain names of web: its KUBE-SVC and the KUBE-SEP of
// pod-a.
func webChains() (svc, sepA string) {
	name := servicePortName(repairKey("web"))
	return chainsFor(name, "tcp").svc, endpointChain(name, "tcp", netip.AddrPortFrom(ktPodA, ktPort))
}

// repairCases are the ways of removing Weir's rules by hand that the
// backend must recover from.
var repairCases = []struct {
	name string
	// nftOnly limits the case to iptables-nft.
	nftOnly bool
	tamper  func(h hand)
	// victim is the service the partial sync after the tampering changes.
	victim string
	// partialRepairs says whether that partial sync repairs everything:
	// whether its restore runs into what was removed, fails, and so
	// rewrites everything at once. Otherwise the partial sync succeeds
	// and the next periodic full sync repairs the rest.
	partialRepairs bool
}{
	{"nat-flushed", false, func(h hand) { h.ipt(ipv4, "-t", "nat", "-F") }, "web", false},
	{"nat-flushed-and-deleted", false, func(h hand) {
		h.ipt(ipv4, "-t", "nat", "-F")
		h.ipt(ipv4, "-t", "nat", "-X")
	}, "web", true},
	{"ipv6-nat-flushed-and-deleted", false, func(h hand) {
		h.ipt(ipv6, "-t", "nat", "-F")
		h.ipt(ipv6, "-t", "nat", "-X")
	}, "web", false},
	{"kube-services-flushed", false, func(h hand) { h.ipt(ipv4, "-t", "nat", "-F", kubeServices) }, "web", false},
	{"svc-chain-deleted", false, func(h hand) {
		svc, _ := webChains()
		h.removeChain(ipv4, "nat", svc)
	}, "web", false},
	{"svc-chain-flushed", false, func(h hand) {
		svc, _ := webChains()
		h.ipt(ipv4, "-t", "nat", "-F", svc)
	}, "web", false},
	{"sep-chain-deleted", false, func(h hand) {
		_, sep := webChains()
		h.removeChain(ipv4, "nat", sep)
	}, "web", false},
	{"ext-chain-deleted", false, func(h hand) {
		h.removeChain(ipv4, "nat", chainsFor(servicePortName(repairKey("np")), "tcp").ext)
	}, "np", false},
	{"jump-deleted", false, func(h hand) {
		h.ipt(ipv4, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", commentServices, "-j", kubeServices)
	}, "web", false},
	{"filter-flushed", false, func(h hand) { h.ipt(ipv4, "-F") }, "none", true},
	{"foreign-rule-in-kube-services", false, func(h hand) { h.ipt(ipv4, "-t", "nat", "-I", kubeServices, "-j", "ACCEPT") }, "web", false},
	{"nft-flush-ruleset", true, func(h hand) { h.flushRuleset() }, "web", true},
}

// TestKernelRepair removes Weir's rules by hand in each way of repairCases,
// for each flavour: the next periodic full sync (a reconcile, well within
// RewritePeriod) must bring every service back; so must, after the same
// tampering again, a partial sync of the victim (at once, when its restore
// runs into the damage) followed by the periodic full sync.
func TestKernelRepair(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		for _, c := range repairCases {
			if c.nftOnly && fl != flavourNFT {
				continue
			}
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				topo := ktTopology(t)
				b := ktBackend(t, topo, fl)
				h := hand{t, topo, b.fl}
				p := repairPlan()
				ktSync(t, b, p, backends.FullSync())
				wantServing(t, topo, p, "before")

				c.tamper(h)
				ktSync(t, b, p, backends.FullSync())
				wantServing(t, topo, p, "periodic full sync after the tampering")

				c.tamper(h)
				repairChange(p, c.victim)
				ktSync(t, b, p, backends.PartialSync(repairKey(c.victim)))
				if c.partialRepairs {
					wantServing(t, topo, p, "partial sync after the tampering")
				}
				ktSync(t, b, p, backends.FullSync())
				wantServing(t, topo, p, "periodic full sync after the partial one")

				tamperDuringPartialSync(t, b, h, p, c.tamper)
				wantServing(t, topo, p, "periodic full sync after tampering during a partial sync")
			})
		}
	})
}

// tamperDuringPartialSync adds a service to p with a partial sync during
// which, between the sync's start and its first restore, tamper runs; then
// it runs the periodic full sync, which must see the damage although the
// partial sync's own writes changed the tables too.
func tamperDuringPartialSync(t *testing.T, b *Backend, h hand, p *plan.Plan, tamper func(hand)) {
	t.Helper()
	extra := ktService("extra", netip.MustParseAddr("10.96.0.13"), ktPodA)
	p.Services[extra.Key] = extra
	tampered := false
	b.rewrite = func(_ ipFamily, text []byte) []byte {
		if !tampered {
			tampered = true
			tamper(h)
		}
		return text
	}
	ktSync(t, b, p, backends.PartialSync(extra.Key))
	b.rewrite = nil
	if !tampered {
		t.Fatal("the partial sync ran no restore")
	}
	ktSync(t, b, p, backends.FullSync())
}

// TestKernelForeignJumpToStaleChain has someone else's chain jump to the
// KUBE-SEP chain of an endpoint that then leaves: the kernel refuses to
// delete that chain, so the partial sync fails, and so would a rewrite
// deleting it. Sync must still converge at once (rewriting without
// deleting stale chains), and the chain left behind must not make every
// later full sync rewrite everything.
func TestKernelForeignJumpToStaleChain(t *testing.T) {
	eachFlavour(t, func(t *testing.T, fl string) {
		topo := ktTopology(t)
		b := ktBackend(t, topo, fl)
		p := repairPlan()
		ktSync(t, b, p, backends.FullSync())
		name := servicePortName(repairKey("web"))
		sepB := endpointChain(name, "tcp", netip.AddrPortFrom(ktPodB, ktPort))
		ktRestore(t, topo, b.fl, ipv4, "*nat\n:FOREIGN - [0:0]\n-A FOREIGN -j "+sepB+"\nCOMMIT\n")

		web := p.Services[repairKey("web")].Clone()
		web.Endpoints = slices.DeleteFunc(web.Endpoints, func(e plan.Endpoint) bool { return e.Address == ktPodB })
		p.Services[web.Key] = web
		ktSync(t, b, p, backends.PartialSync(web.Key))
		addr := netip.AddrPortFrom(ktVIP, 80)
		netns.WantPods(t, "after pod-b left", netns.DialMany(t, topo.Client, addr, 12), "pod-a")
		if nat := ktSave(t, topo, b.fl, ipv4, tableNAT); !strings.Contains(nat, "-A FOREIGN -j "+sepB) {
			t.Errorf("the foreign rule is gone:\n%s", nat)
		}

		var texts []string
		b.rewrite = func(f ipFamily, text []byte) []byte {
			if hasRules(text) {
				texts = append(texts, string(text))
			}
			return text
		}
		ktSync(t, b, p, backends.FullSync())
		if len(texts) != 0 {
			t.Errorf("a periodic full sync after the stale chain stayed ran restores:\n%s", strings.Join(texts, "\n"))
		}
		wantServing(t, topo, p, "after the periodic full sync")
	})
}
