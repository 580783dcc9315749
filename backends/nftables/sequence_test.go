package nftables

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

// The sequence test drives a backend over the fake kernel through full and
// partial syncs of a changing plan. After each step the fake's tables must
// be exactly those a from-scratch full sync of the same plan gives on a
// fresh fake: partial syncs converge to what a full one writes. No root is
// needed.

// fakeBackend returns a backend that commits to a fresh fake kernel.
func fakeBackend(t *testing.T, opts Options) (*Backend, *fakeKernel) {
	t.Helper()
	k := newFakeKernel()
	opts.Log = slog.New(slog.DiscardHandler)
	b := newBackend(opts, k)
	t.Cleanup(func() { b.Close() })
	return b, k
}

// seqService is a TCP service port with the given cluster IPs.
func seqService(name string, port uint16, clusterIPs ...string) *plan.Service {
	s := &plan.Service{Key: plan.Key{Namespace: "default", Name: name, Port: "p", Protocol: plan.TCP}, Port: port}
	s.ClusterIPs = seqAddrs(clusterIPs...)
	return s
}

func seqAddrs(addrs ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// seqEndpoint is a ready endpoint; local ones run on this node.
func seqEndpoint(addr string, port uint16, weight uint32, local bool) plan.Endpoint {
	return plan.Endpoint{Address: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true,
		ForCluster: true, ForLocal: local, Local: local, Weight: weight}
}

// seqPlan has a service of each shape the layout writes: weights,
// dual-stack, node ports, external and load-balancer IPs with source
// ranges, ClientIP affinity, Local policies with and without a local
// endpoint, no endpoints at all, a drained endpoint, UDP, SCTP and IPv6
// only. The doomed services are deleted by a later step; their
// addresses are their own.
func seqPlan() *plan.Plan {
	web := seqService("web", 80, "10.96.0.10", "fd00:10:96::10")
	web.NodePort = 30080
	web.ExternalIPs = seqAddrs("192.0.2.10")
	web.LoadBalancerIPs = seqAddrs("198.51.100.10", "2001:db8::10")
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:1::/48")}
	web.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.11", 8080, 1, true), seqEndpoint("10.244.1.12", 8080, 3, false),
		seqEndpoint("fd00:10:244::11", 8080, 1, true)}

	sticky := seqService("sticky", 80, "10.96.0.11", "fd00:10:96::11")
	sticky.NodePort = 30081
	sticky.Affinity = &plan.Affinity{TimeoutSeconds: 600}
	sticky.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.11", 8080, 2, true), seqEndpoint("10.244.1.13", 8080, 1, false),
		seqEndpoint("fd00:10:244::12", 8080, 1, false)}

	local := seqService("local", 80, "10.96.0.12")
	local.NodePort, local.ExternalLocal = 30082, true
	local.ExternalIPs = seqAddrs("192.0.2.12")
	local.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.14", 8080, 1, true), seqEndpoint("10.244.1.14", 8080, 1, false)}

	elsewhere := seqService("elsewhere", 80, "10.96.0.13")
	elsewhere.NodePort, elsewhere.ExternalLocal = 30083, true
	elsewhere.LoadBalancerIPs = seqAddrs("198.51.100.13")
	elsewhere.Endpoints = []plan.Endpoint{seqEndpoint("10.244.1.15", 8080, 1, false)}

	internal := seqService("internal", 80, "10.96.0.14")
	internal.InternalLocal = true
	internal.Endpoints = []plan.Endpoint{seqEndpoint("10.244.1.16", 8080, 1, false)}

	empty := seqService("empty", 80, "10.96.0.15")
	empty.NodePort, empty.ExternalIPs = 30085, seqAddrs("192.0.2.15")

	drained := seqService("drained", 80, "10.96.0.16")
	drained.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.17", 8080, 0, true), seqEndpoint("10.244.1.17", 8080, 2, false)}

	dns := seqService("dns", 53, "10.96.0.53")
	dns.Key.Protocol = plan.UDP
	dns.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.18", 53, 1, true), seqEndpoint("10.244.1.18", 53, 1, false)}

	sctp := seqService("sctp", 9999, "10.96.0.19")
	sctp.Key.Protocol = plan.SCTP
	sctp.Endpoints = []plan.Endpoint{seqEndpoint("10.244.1.19", 9999, 1, false)}

	only6 := seqService("only6", 80, "fd00:10:96::17")
	only6.NodePort = 30087
	only6.Endpoints = []plan.Endpoint{seqEndpoint("fd00:10:244::17", 8080, 2, false)}

	p := &plan.Plan{Services: map[plan.Key]*plan.Service{}, Node: plan.Node{Name: "node",
		Addresses: seqAddrs("172.30.0.1", "fd00:172:30::1"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")}}
	for _, s := range []*plan.Service{web, sticky, local, elsewhere, internal, empty, drained, dns, sctp, only6, doomed(), doomedPlain()} {
		p.Services[s.Key] = s
	}
	return p
}

// doomed is a dual-stack service of every kind of entry, with affinity.
func doomed() *plan.Service {
	s := seqService("doomed", 7777, "10.96.0.77", "fd00:10:96::77")
	s.NodePort = 30077
	s.ExternalIPs = seqAddrs("192.0.2.77")
	s.LoadBalancerIPs = seqAddrs("198.51.100.77")
	s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	s.Affinity = &plan.Affinity{TimeoutSeconds: 30}
	s.Endpoints = []plan.Endpoint{seqEndpoint("10.244.7.7", 7070, 1, true), seqEndpoint("fd00:10:244::77", 7070, 1, false)}
	return s
}

// doomedPlain is a dual-stack service without affinity whose pools share
// their endpoints maps and pick chains with other services: Local
// external policy with a local endpoint, a load-balancer IP with a source
// range.
func doomedPlain() *plan.Service {
	s := seqService("doomed-plain", 7778, "10.96.0.78", "fd00:10:96::78")
	s.NodePort, s.ExternalLocal = 30078, true
	s.ExternalIPs = seqAddrs("192.0.2.78")
	s.LoadBalancerIPs = seqAddrs("198.51.100.78", "2001:db8::78")
	s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.114.0/24")}
	s.Endpoints = []plan.Endpoint{seqEndpoint("10.244.0.78", 7070, 1, true), seqEndpoint("10.244.1.78", 7070, 3, false),
		seqEndpoint("fd00:10:244::78", 7070, 1, false)}
	return s
}

// doomedTraces are the strings in a dump that only the doomed services'
// objects hold.
var doomedTraces = []string{"10.96.0.77", "fd00:10:96::77", "192.0.2.77", "198.51.100.77", "203.0.113.",
	"30077", "7777", "10.244.7.7", "fd00:10:244::77", "/doomed/",
	"10.96.0.78", "fd00:10:96::78", "192.0.2.78", "198.51.100.78", "2001:db8::78", "203.0.114.",
	"30078", "7778", "10.244.0.78", "10.244.1.78", "fd00:10:244::78"}

// sequence runs the backend through the steps, checking each.
type sequence struct {
	t    *testing.T
	opts Options
	b    *Backend
	k    *fakeKernel
	p    *plan.Plan
}

// sync syncs p as asked and compares the result with a fresh full sync.
func (s *sequence) sync(step string, req backends.SyncRequest) {
	s.t.Helper()
	if err := s.b.Sync(context.Background(), s.p, req); err != nil {
		s.t.Fatalf("%s: %v", step, err)
	}
	if s.k.refused > 0 {
		// Sync rebuilds after a refused commit and succeeds: that must not
		// hide a commit the kernel would have refused.
		s.t.Fatalf("%s: the fake refused %d commits, the latest with: %v", step, s.k.refused, s.k.refusal)
	}
	s.converged(step)
}

// converged fails the test unless the fake holds what a from-scratch
// full sync of the plan writes.
func (s *sequence) converged(step string) {
	s.t.Helper()
	fresh, k := fakeBackend(s.t, s.opts)
	if err := fresh.Sync(context.Background(), s.p, backends.FullSync()); err != nil {
		s.t.Fatalf("%s: full sync of a fresh backend: %v", step, err)
	}
	if got, want := s.k.dump(true), k.dump(true); got != want {
		s.t.Fatalf("%s: the tables differ from a fresh full sync's:\n%s", step, dumpDiff(s.k.dump(false), k.dump(false), got, want))
	}
}

// dumpDiff lists the lines only one dump has, each with the table and
// chain or set it is in: first of the readable dumps, then, when those
// agree, of the raw ones.
func dumpDiff(got, want, rawGot, rawWant string) string {
	var out []string
	only := func(sign, a, b string) {
		have := map[string]bool{}
		for _, l := range contextLines(b) {
			have[l] = true
		}
		for _, l := range contextLines(a) {
			if !have[l] {
				out = append(out, sign+" "+l)
			}
		}
	}
	only("-", want, got)
	only("+", got, want)
	if len(out) == 0 {
		only("-", rawWant, rawGot)
		only("+", rawGot, rawWant)
	}
	if len(out) == 0 {
		return "the same lines in another order; got:\n" + got + "want:\n" + want
	}
	return strings.Join(out, "\n")
}

// contextLines prefixes each line of a dump with its table and chain or
// set.
func contextLines(dump string) []string {
	var out []string
	var table, object string
	for _, l := range strings.Split(strings.TrimSuffix(dump, "\n"), "\n") {
		switch {
		case !strings.HasPrefix(l, "\t"):
			table, object = l, ""
			out = append(out, l)
		case !strings.HasPrefix(l, "\t\t"):
			object = strings.TrimSpace(l)
			out = append(out, table+": "+object)
		default:
			out = append(out, table+": "+object+": "+strings.TrimSpace(l))
		}
	}
	return out
}

// edit replaces the named service with a changed clone and returns its key.
func (s *sequence) edit(name string, change func(*plan.Service)) plan.Key {
	for k, svc := range s.p.Services {
		if svc.Key.Name == name {
			c := svc.Clone()
			change(c)
			s.p.Services[k] = c
			return k
		}
	}
	s.t.Fatalf("no service %s", name)
	return plan.Key{}
}

// traces returns the lines of the fake's dump that hold one of the strings.
func (s *sequence) traces(of []string) []string {
	var out []string
	for _, l := range contextLines(s.k.dump(false)) {
		if slices.ContainsFunc(of, func(t string) bool { return strings.Contains(l, t) }) {
			out = append(out, l)
		}
	}
	return out
}

func TestSequencePartialSyncsConverge(t *testing.T) {
	for _, o := range optionSets {
		t.Run(o.name, func(t *testing.T) {
			s := &sequence{t: t, opts: Options{Common: o.opts}, p: seqPlan()}
			s.b, s.k = fakeBackend(t, s.opts)
			s.run()
		})
	}
}

func (s *sequence) run() {
	s.sync("the first full sync", backends.FullSync())
	if len(s.traces(doomedTraces)) < 30 {
		s.t.Fatalf("doomed left only these traces after the full sync: %q", s.traces(doomedTraces))
	}
	if s.opts.LocalhostNodePorts && !s.k.localnet {
		s.t.Errorf("localhost node ports, but route_localnet was not turned on")
	}
	s.changeServices()
	s.deleteDoomed()
	s.changeNode()
	s.changePolicies()
	s.quietAndRepair()
	s.failedCommit()
	s.deleteEverything()
}

func (s *sequence) changeServices() {
	added := seqService("added", 8080, "10.96.0.18", "fd00:10:96::18")
	added.NodePort = 30088
	added.Endpoints = []plan.Endpoint{seqEndpoint("10.244.1.20", 8080, 1, false), seqEndpoint("fd00:10:244::20", 8080, 1, false)}
	s.p.Services[added.Key] = added
	s.sync("adding a service", backends.PartialSync(added.Key))

	web := s.edit("web", func(svc *plan.Service) { svc.Endpoints[1] = seqEndpoint("10.244.1.21", 8080, 3, false) })
	s.sync("replacing an endpoint", backends.PartialSync(web))
	web = s.edit("web", func(svc *plan.Service) { svc.Endpoints[0].Weight = 2 })
	sticky := s.edit("sticky", func(svc *plan.Service) { svc.Endpoints = svc.Endpoints[1:] })
	s.sync("changing weights and an affinity service's endpoints", backends.PartialSync(web, sticky))
	empty := s.edit("empty", func(svc *plan.Service) { svc.Endpoints = []plan.Endpoint{seqEndpoint("10.244.1.22", 8080, 1, false)} })
	dns := s.edit("dns", func(svc *plan.Service) { svc.Endpoints = nil })
	s.sync("giving endpoints to one service and taking them from another", backends.PartialSync(empty, dns))
	// Only endpoints on this node are hairpin entries, as in kube-proxy's
	// nftables mode: one moving here gains its entry.
	if got := s.traces([]string{"10.244.1.22 . 10.244.1.22"}); len(got) > 0 {
		s.t.Errorf("an endpoint elsewhere has a hairpin entry:\n%s", strings.Join(got, "\n"))
	}
	empty = s.edit("empty", func(svc *plan.Service) { svc.Endpoints[0].Local = true })
	s.sync("an endpoint moving to this node", backends.PartialSync(empty))
	if got := s.traces([]string{"10.244.1.22 . 10.244.1.22"}); len(got) == 0 {
		s.t.Error("an endpoint on this node has no hairpin entry")
	}
}

func (s *sequence) deleteDoomed() {
	key, plain := doomed().Key, doomedPlain().Key
	delete(s.p.Services, key)
	delete(s.p.Services, plain)
	s.sync("deleting two services", backends.PartialSync(key, plain, key))
	if left := s.traces(doomedTraces); len(left) > 0 {
		s.t.Fatalf("the deleted services left:\n%s", strings.Join(left, "\n"))
	}
	ghost := plan.Key{Namespace: "default", Name: "ghost", Port: "p", Protocol: plan.TCP}
	s.sync("deleting it again, and a service never synced", backends.PartialSync(key, ghost))
}

func (s *sequence) changeNode() {
	s.p.Node.Addresses = seqAddrs("172.30.0.2", "fd00:172:30::2")
	s.p.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}
	s.p.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	s.sync("changing the node's addresses and pod CIDRs and the service CIDRs", backends.PartialSync())
	// web's source ranges now hold the node: its load-balancer IPs become
	// allowed sources of their own, in both families.
	s.p.Node.Addresses = seqAddrs("10.0.0.1", "2001:db8:1::1")
	s.sync("moving the node into a service's source ranges", backends.PartialSync())
	if got := s.traces([]string{"firewall-allow"}); !slices.ContainsFunc(got, func(l string) bool {
		return strings.Contains(l, "198.51.100.10 . tcp . 80 . 198.51.100.10-198.51.100.10")
	}) {
		s.t.Errorf("the node in web's ranges, but firewall-allow does not let its load-balancer IP in:\n%s", strings.Join(got, "\n"))
	}
	s.p.Node.Addresses = nil
	s.sync("losing the node's addresses", backends.PartialSync())
}

func (s *sequence) changePolicies() {
	keys := []plan.Key{
		s.edit("web", func(svc *plan.Service) { svc.SourceRanges, svc.ExternalLocal = nil, true }),
		s.edit("local", func(svc *plan.Service) { svc.ExternalLocal, svc.NodePort = false, 30090 }),
		s.edit("sticky", func(svc *plan.Service) { svc.Affinity = nil }),
		s.edit("internal", func(svc *plan.Service) {
			svc.Affinity = &plan.Affinity{TimeoutSeconds: 60}
			svc.InternalLocal = false
		}),
		s.edit("drained", func(svc *plan.Service) { svc.Endpoints[0].Weight = 2 }),
		s.edit("elsewhere", func(svc *plan.Service) {
			svc.LoadBalancerIPs = seqAddrs("198.51.100.14")
			svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
		}),
	}
	s.sync("changing policies, affinity, ranges and node ports", backends.PartialSync(keys...))
	s.sync("a periodic full sync", backends.FullSync())
}

// quietAndRepair checks the full syncs the generation decides: none writes
// anything when nothing changed, and one after another process's change
// repairs it.
func (s *sequence) quietAndRepair() {
	before := s.k.commits
	s.sync("a full sync with nothing changed", backends.FullSync())
	if s.k.commits != before {
		s.t.Errorf("a full sync with nothing changed committed %d times", s.k.commits-before)
	}
	// Another process moves an entry to another set, empties a chain and
	// adds a table of its own.
	unrelated := fakeTableID{famV4.table, "unrelated"}
	s.k.change(func(k *fakeKernel) {
		ip := k.tables[fakeTableID{famV4.table, "weir"}]
		for _, id := range slices.Sorted(maps.Keys(ip.sets[setServiceIPs].elems))[:1] {
			ip.sets[setNoEPIPs].elems[id] = element{key: ip.sets[setServiceIPs].elems[id].key}
			delete(ip.sets[setServiceIPs].elems, id)
		}
		ip.chains[chainMasquerade].rules = nil
		k.tables[unrelated] = &fakeTable{fam: famV4, chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
	})
	if err := s.b.Sync(context.Background(), s.p, backends.FullSync()); err != nil || s.k.refused > 0 {
		s.t.Fatalf("the full sync after another process's change: %v, %v", err, s.k.refusal)
	}
	if s.k.tables[unrelated] == nil {
		s.t.Fatalf("the full sync removed another process's table")
	}
	delete(s.k.tables, unrelated)
	s.converged("a full sync after another process's change")
}

// failedCommit makes a partial sync's commit fail: Sync rebuilds the tables
// from scratch.
func (s *sequence) failedCommit() {
	s.k.failNext = errors.New("netlink: lost")
	web := s.edit("web", func(svc *plan.Service) { svc.Endpoints = svc.Endpoints[:1] })
	if err := s.b.Sync(context.Background(), s.p, backends.PartialSync(web)); err != nil {
		s.t.Fatalf("the rebuild after a failed commit: %v", err)
	}
	s.k.refused = 0
	s.converged("the rebuild after a failed commit")
	sticky := s.edit("sticky", func(svc *plan.Service) { svc.Affinity = &plan.Affinity{TimeoutSeconds: 5} })
	s.sync("a partial sync after the rebuild", backends.PartialSync(sticky))
}

func (s *sequence) deleteEverything() {
	keys := s.p.Keys()
	s.p.Services = map[plan.Key]*plan.Service{}
	s.sync("deleting every service", backends.PartialSync(keys...))
	for id, t := range s.k.tables {
		for name := range t.chains {
			if _, pick := parsePickChain(name); pick || isStickyChain(name) {
				s.t.Errorf("%s %s: chain %s is left with no services", t.fam.kw, id.name, name)
			}
		}
		for name, set := range t.sets {
			// Only the node's own sets may hold elements.
			if _, buckets := parseEndpointsMap(name); buckets || (len(set.elems) > 0 && !nodeSets[name]) {
				s.t.Errorf("%s %s: set %s is left with %d elements and no services", t.fam.kw, id.name, name, len(set.elems))
			}
		}
	}
}

// nodeSets are the sets whose elements follow the options and the node,
// not the services.
var nodeSets = map[string]bool{setClusterCIDRs: true, setPodCIDRs: true, setNodePortCIDRs: true, setServiceCIDRs: true}

// TestSequenceFakeRefusesStaleChanges shows the fake failing a commit the
// way the kernel would: an element added twice with other data, and one
// deleted that is not there.
func TestSequenceFakeRefusesStaleChanges(t *testing.T) {
	b, k := fakeBackend(t, Options{})
	p := seqPlan()
	if err := b.Sync(context.Background(), p, backends.FullSync()); err != nil {
		t.Fatal(err)
	}
	tb := b.tables[0]
	web := p.Services[plan.Key{Namespace: "default", Name: "web", Port: "p", Protocol: plan.TCP}]
	key := ipKey(web.ClusterIPs[0], web.Key.Protocol, web.Port)
	other := &txn{table: tb.layout.table}
	other.addElems(tb.layout.setNamed(setServiceIPs), gotoElement(key, pickSpec{kind: pickCluster, weight: 1}.chain()))
	if err := k.commit([]*txn{other}); !errors.Is(err, unix.EEXIST) {
		t.Errorf("adding an element that exists with another verdict: %v, want EEXIST", err)
	}
	missing := &txn{table: tb.layout.table}
	missing.delElems(tb.layout.setNamed(setNoEPIPs), element{key: key})
	if err := k.commit([]*txn{missing}); !errors.Is(err, unix.ENOENT) {
		t.Errorf("deleting an element that is not there: %v, want ENOENT", err)
	}
	if k.refused != 2 || k.commits != 1 {
		t.Errorf("the fake counted %d commits and %d refusals, want 1 and 2", k.commits, k.refused)
	}
}
