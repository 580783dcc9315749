package iptables

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/golden"
	"github.com/weirproxy/weir/sdk/plan"
)

// partialBase is the plan partial syncs start from: a cluster IP, a UDP
// service, a load balancer with source ranges and a Local-policy node port.
func partialBase() *plan.Plan {
	lb := goldSvc("shop", "https", plan.TCP, "10.96.0.21", 443, 30443, goldEP("10.244.0.12", 8080, 1))
	lb.LoadBalancerIPs = addrs("198.51.100.5")
	lb.SourceRanges = prefixes("10.244.0.0/24")
	etp := goldSvc("edge", "http", plan.TCP, "10.96.0.30", 80, 30080, goldLocal(goldEP("10.244.0.11", 8080, 1)), goldEP("10.244.0.12", 8080, 1))
	etp.ExternalLocal, etp.HealthCheckNodePort = true, 32000
	return goldPlan(
		goldSvc("web", "http", plan.TCP, "10.96.0.10", 80, 0,
			goldEP("10.244.0.11", 8080, 1), goldEP("10.244.0.12", 8080, 1), goldEP("10.244.0.13", 8080, 1)),
		goldSvc("dns", "dns", plan.UDP, "10.96.0.53", 53, 0, goldEP("10.244.0.14", 53, 1)),
		lb, etp)
}

func key(name, port string, proto plan.Protocol) plan.Key {
	return plan.Key{Namespace: "default", Name: name, Port: port, Protocol: proto}
}

// partialStep changes a clone of the base plan and names the keys it changed.
type partialStep struct {
	name   string
	change func(p *plan.Plan) []plan.Key
}

var partialSteps = []partialStep{
	{"partial-add", func(p *plan.Plan) []plan.Key {
		s := goldSvc("new", "http", plan.TCP, "10.96.0.40", 80, 30090, goldEP("10.244.0.15", 8080, 1))
		p.Services[s.Key] = s
		return []plan.Key{s.Key}
	}},
	{"partial-replace-endpoint", func(p *plan.Plan) []plan.Key {
		s := p.Services[key("web", "http", plan.TCP)]
		s.Endpoints[2] = goldEP("10.244.0.16", 8080, 1)
		return []plan.Key{s.Key}
	}},
	{"partial-weights", func(p *plan.Plan) []plan.Key {
		s := p.Services[key("web", "http", plan.TCP)]
		s.Endpoints[0].Weight, s.Endpoints[1].Weight = 9, 0
		return []plan.Key{s.Key}
	}},
	{"partial-remove", func(p *plan.Plan) []plan.Key {
		delete(p.Services, key("dns", "dns", plan.UDP))
		return []plan.Key{key("dns", "dns", plan.UDP)}
	}},
	{"partial-no-endpoints", func(p *plan.Plan) []plan.Key {
		p.Services[key("shop", "https", plan.TCP)].Endpoints = nil
		return []plan.Key{key("shop", "https", plan.TCP)}
	}},
	{"partial-source-range", func(p *plan.Plan) []plan.Key {
		s := p.Services[key("shop", "https", plan.TCP)]
		s.SourceRanges = prefixes("10.244.0.0/24", "172.30.0.0/24")
		return []plan.Key{s.Key}
	}},
	{"partial-local-endpoint-leaves", func(p *plan.Plan) []plan.Key {
		s := p.Services[key("edge", "http", plan.TCP)]
		s.Endpoints = s.Endpoints[1:]
		return []plan.Key{s.Key}
	}},
	{"partial-affinity", func(p *plan.Plan) []plan.Key {
		s := p.Services[key("web", "http", plan.TCP)]
		s.Affinity = &plan.Affinity{TimeoutSeconds: 600}
		return []plan.Key{s.Key}
	}},
}

func TestGoldenPartial(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	base := partialBase()
	full, prev := renderFull(ipv4, base, o, nil)
	for _, step := range partialSteps {
		t.Run(step.name, func(t *testing.T) {
			p := base.Clone()
			changed := step.change(p)
			r, w := renderPartial(ipv4, p, changed, prev, o)
			text := restoreText(r)
			golden.Compare(t, filepath.Join("testdata", step.name+".golden"), text)
			// Only the changed service appears in the text.
			for k := range base.Services {
				if !slices.Contains(changed, k) && strings.Contains(text, servicePortName(k)) {
					t.Errorf("the text mentions unchanged service %s", servicePortName(k))
				}
			}
			if strings.Contains(text, ":"+kubeServices) || strings.Contains(text, ":"+kubeNodePorts) {
				t.Error("a partial sync flushes a fixed chain")
			}
			wantSameKernel(t, full, r, p, o)
			wantSameWritten(t, w, p, o)
		})
	}
}

// wantSameKernel checks that the partial restore applied over the full one
// gives the kernel what a full render of p gives.
func wantSameKernel(t *testing.T, before, partial restore, p *plan.Plan, o *Options) {
	t.Helper()
	got := fakeKernel{}
	got.applyRestore(t, before)
	got.applyRestore(t, partial)
	wantFull, w := renderFull(ipv4, p, o, nil)
	want := fakeKernel{}
	want.applyRestore(t, wantFull)
	for _, d := range got.sameAs(want, w.trailer) {
		t.Error(d)
	}
}

// wantSameWritten checks that w holds what a full render of p writes.
func wantSameWritten(t *testing.T, w *written, p *plan.Plan, o *Options) {
	t.Helper()
	_, want := renderFull(ipv4, p, o, nil)
	got := map[plan.Key]*svcWritten{}
	w.each(func(k plan.Key, s *svcWritten) { got[k] = s })
	exp := map[plan.Key]*svcWritten{}
	want.each(func(k plan.Key, s *svcWritten) { exp[k] = s })
	if !maps.EqualFunc(got, exp, func(a, b *svcWritten) bool { return reflect.DeepEqual(a, b) }) {
		t.Errorf("written state differs from a full render's:\n got %v\nwant %v", got, exp)
	}
	if !slices.Equal(w.trailer, want.trailer) || !slices.Equal(w.podCIDRs, want.podCIDRs) {
		t.Errorf("node state %v %v, want %v %v", w.trailer, w.podCIDRs, want.trailer, want.podCIDRs)
	}
	if w.endpoints != want.endpoints || w.quiet != want.quiet {
		t.Errorf("endpoints %d (quiet %v), want %d (quiet %v)", w.endpoints, w.quiet, want.endpoints, want.quiet)
	}
	if w.nodeIP != want.nodeIP || !maps.Equal(w.ranged, want.ranged) {
		t.Errorf("node IP %s, ranged %v, want %s, %v", w.nodeIP, w.ranged, want.nodeIP, want.ranged)
	}
}

func TestRenderPartialLeavesPrevUnchanged(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	base := partialBase()
	_, prev := renderFull(ipv4, base, o, nil)
	// A few partials on top so prev has a delta too.
	for _, step := range partialSteps[:2] {
		p := base.Clone()
		_, prev = renderPartial(ipv4, p, step.change(p), prev, o)
	}
	snapshot := snapshotWritten(prev)
	firstText := ""
	for i, step := range partialSteps {
		p := base.Clone()
		changed := step.change(p)
		r, _ := renderPartial(ipv4, p, changed, prev, o)
		if i == 0 {
			firstText = restoreText(r)
		}
		if got := snapshotWritten(prev); !reflect.DeepEqual(got, snapshot) {
			t.Fatalf("%s changed prev", step.name)
		}
	}
	// The same render again (say, after a failed restore) gives the same text.
	p := base.Clone()
	r, _ := renderPartial(ipv4, p, partialSteps[0].change(p), prev, o)
	if restoreText(r) != firstText {
		t.Error("rendering the same change twice from prev gives different texts")
	}
}

// snapshotWritten copies everything w holds.
func snapshotWritten(w *written) any {
	type snap struct {
		Base, Delta map[plan.Key]svcWritten
		PodCIDRs    []netip.Prefix
		Trailer     []string
		Ranged      map[plan.Key]bool
	}
	s := snap{Base: map[plan.Key]svcWritten{}, Delta: map[plan.Key]svcWritten{}, PodCIDRs: slices.Clone(w.podCIDRs),
		Trailer: slices.Clone(w.trailer), Ranged: maps.Clone(w.ranged)}
	for k, v := range w.base {
		s.Base[k] = svcWritten{chains: slices.Clone(v.chains), rules: slices.Clone(v.rules)}
	}
	for k, v := range w.delta {
		if v == nil {
			s.Delta[k] = svcWritten{}
			continue
		}
		s.Delta[k] = svcWritten{chains: slices.Clone(v.chains), rules: slices.Clone(v.rules)}
	}
	return s
}

func TestRenderPartialWithoutChangeWritesNothing(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	p := partialBase()
	_, prev := renderFull(ipv4, p, o, nil)
	r, w := renderPartial(ipv4, p, p.Keys(), prev, o)
	if r.NAT != nil || r.Filter != nil {
		t.Errorf("unchanged services give a restore:\n%s", restoreText(r))
	}
	wantSameWritten(t, w, p, o)
	// A key of no service in this family writes nothing either.
	_, prev6 := renderFull(ipv6, p, o, nil)
	r, _ = renderPartial(ipv6, p, []plan.Key{key("web", "http", plan.TCP), key("gone", "", plan.TCP)}, prev6, o)
	if r.NAT != nil || r.Filter != nil {
		t.Errorf("IPv4 services give an IPv6 restore:\n%s", restoreText(r))
	}
}

func TestGoldenPartialFollowsNodeAddresses(t *testing.T) {
	o := &Options{Common: backends.Common{NodePortPrimary: true}}
	p := partialBase()
	full, prev := renderFull(ipv4, p, o, nil)
	p2 := p.Clone()
	p2.Node.Addresses = addrs("192.168.0.3", "fd00::3")
	r, w := renderPartial(ipv4, p2, nil, prev, o)
	golden.Compare(t, filepath.Join("testdata", "partial-node-addresses.golden"), restoreText(r))
	wantSameKernel(t, full, r, p2, o)
	wantSameWritten(t, w, p2, o)
}

// TestGoldenPartialNodeIPInRanges moves the node's IP into shop's source
// range: only shop's KUBE-FW chain is written again, now letting its
// load-balancer IP in as a source, as kube-proxy's allowFromNode does.
func TestGoldenPartialNodeIPInRanges(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	p := partialBase()
	full, prev := renderFull(ipv4, p, o, nil)
	p2 := p.Clone()
	p2.Node.Addresses = addrs("10.244.0.1")
	r, w := renderPartial(ipv4, p2, nil, prev, o)
	golden.Compare(t, filepath.Join("testdata", "partial-node-in-range.golden"), restoreText(r))
	wantSameKernel(t, full, r, p2, o)
	wantSameWritten(t, w, p2, o)
	if !maps.Equal(w.ranged, map[plan.Key]bool{key("shop", "https", plan.TCP): true}) {
		t.Errorf("ranged services %v, want only shop", w.ranged)
	}
}

func TestRenderPartialRewritesAllForNewPodCIDRs(t *testing.T) {
	o := &Options{Common: backends.Common{LocalDetector: backends.DetectNodeCIDR}}
	p := partialBase()
	full, prev := renderFull(ipv4, p, o, nil)
	p2 := p.Clone()
	p2.Node.PodCIDRs = prefixes("10.244.1.0/24")
	r, w := renderPartial(ipv4, p2, nil, prev, o)
	if !strings.Contains(string(r.NAT), ":"+kubeServices+" ") || !strings.Contains(string(r.NAT), "! -s 10.244.1.0/24") {
		t.Errorf("new podCIDRs do not rewrite everything:\n%s", r.NAT)
	}
	wantSameKernel(t, full, r, p2, o)
	wantSameWritten(t, w, p2, o)
}

// TestRenderPartialCrossesLargeCluster grows a plan past
// largeClusterEndpoints with one partial sync and shrinks it back with
// another: each crossing rewrites every chain, without and then again with
// the per-endpoint comments, while the service-level comments stay.
func TestRenderPartialCrossesLargeCluster(t *testing.T) {
	o := &Options{Common: backends.Common{ClusterCIDRs: podCIDR}}
	p := goldPlan()
	for i := range 99 {
		s := goldSvc(fmt.Sprintf("s%d", i), "http", plan.TCP, fmt.Sprintf("10.96.1.%d", i), 80, 0)
		for j := range 10 {
			s.Endpoints = append(s.Endpoints, goldEP(fmt.Sprintf("10.244.%d.%d", i, j), 8080, 1))
		}
		p.Services[s.Key] = s
	}
	full, prev := renderFull(ipv4, p, o, nil)
	if prev.quiet || !strings.Contains(string(full.NAT), `-> 10.244.0.0:8080"`) {
		t.Fatalf("990 endpoints render quietly")
	}
	big := goldSvc("big", "http", plan.TCP, "10.96.2.1", 80, 0,
		goldEP("10.244.200.1", 8080, 1), goldEP("10.244.200.2", 8080, 1), goldEP("10.244.200.3", 8080, 1),
		goldEP("10.244.200.4", 8080, 1), goldEP("10.244.200.5", 8080, 1), goldEP("10.244.200.6", 8080, 1),
		goldEP("10.244.200.7", 8080, 1), goldEP("10.244.200.8", 8080, 1), goldEP("10.244.200.9", 8080, 1),
		goldEP("10.244.200.10", 8080, 1), goldEP("10.244.200.11", 8080, 1))
	p.Services[big.Key] = big
	grown, w := renderPartial(ipv4, p, []plan.Key{big.Key}, prev, o)
	text := string(grown.NAT)
	if !w.quiet || !strings.Contains(text, ":"+kubeServices+" ") || strings.Contains(text, " -> ") ||
		strings.Contains(text, `--comment "default/s0:http" -s`) || !strings.Contains(text, `"default/s0:http cluster IP"`) {
		t.Errorf("1001 endpoints: want every chain rewritten without per-endpoint comments:\n%.2000s", text)
	}
	wantSameKernel(t, full, grown, p, o)
	wantSameWritten(t, w, p, o)

	delete(p.Services, big.Key)
	shrunk, w2 := renderPartial(ipv4, p, []plan.Key{big.Key}, w, o)
	if w2.quiet || !strings.Contains(string(shrunk.NAT), `-> 10.244.0.0:8080"`) {
		t.Errorf("back to 990 endpoints: want the comments back:\n%.2000s", shrunk.NAT)
	}
	wantSameWritten(t, w2, p, o)
}

// TestRenderPartialSequence applies many random partial syncs, more than
// the delta limit, and checks after each that the kernel and the written state
// are what a full render of the plan gives.
func TestRenderPartialSequence(t *testing.T) {
	for _, o := range []*Options{
		{Common: backends.Common{ClusterCIDRs: podCIDR}},
		{Common: backends.Common{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth", LocalhostNodePorts: true}},
	} {
		t.Run(fmt.Sprint(o.Detector()), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			p := goldPlan()
			for i := range 40 {
				s := randomService(rng, i)
				p.Services[s.Key] = s
			}
			full, prev := renderFull(ipv4, p, o, nil)
			k := fakeKernel{}
			k.applyRestore(t, full)
			for step := range 400 {
				changed := mutate(rng, p)
				r, w := renderPartial(ipv4, p, changed, prev, o)
				k.applyRestore(t, r)
				want := fakeKernel{}
				wantFull, ww := renderFull(ipv4, p, o, nil)
				want.applyRestore(t, wantFull)
				if d := k.sameAs(want, ww.trailer); len(d) > 0 {
					t.Fatalf("step %d (%v): %s", step, changed, strings.Join(d, "\n"))
				}
				prev = w
			}
			wantSameWritten(t, prev, p, o)
		})
	}
}

// randomService returns service i with random traits.
func randomService(rng *rand.Rand, i int) *plan.Service {
	proto := []plan.Protocol{plan.TCP, plan.UDP}[rng.IntN(2)]
	s := goldSvc(fmt.Sprintf("svc-%d", i), "p", proto, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, 0)
	if rng.IntN(3) == 0 {
		s.NodePort = uint16(30000 + i)
	}
	if rng.IntN(4) == 0 {
		s.LoadBalancerIPs = addrs(fmt.Sprintf("198.51.100.%d", i%250+1))
		if rng.IntN(2) == 0 {
			s.SourceRanges = prefixes("10.244.0.0/24")
		}
	}
	s.ExternalLocal = rng.IntN(3) == 0
	s.InternalLocal = rng.IntN(5) == 0
	if rng.IntN(4) == 0 {
		s.Affinity = &plan.Affinity{TimeoutSeconds: 60}
	}
	s.Endpoints = randomEndpoints(rng)
	return s
}

func randomEndpoints(rng *rand.Rand) []plan.Endpoint {
	var eps []plan.Endpoint
	for j := range rng.IntN(5) {
		e := goldEP(fmt.Sprintf("10.244.0.%d", 10+rng.IntN(6)), 8080, uint32(rng.IntN(3)))
		if slices.ContainsFunc(eps, func(x plan.Endpoint) bool { return x.Address == e.Address }) {
			continue
		}
		if j%2 == 0 {
			e = goldLocal(e)
		}
		eps = append(eps, e)
	}
	return eps
}

// mutate changes, adds or deletes a few services and returns their keys.
func mutate(rng *rand.Rand, p *plan.Plan) []plan.Key {
	var changed []plan.Key
	keys := p.Keys()
	for range 1 + rng.IntN(3) {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(6) {
		case 0:
			delete(p.Services, k)
		case 1:
			i := 100 + rng.IntN(200)
			s := randomService(rng, i)
			p.Services[s.Key] = s
			k = s.Key
		case 2:
			s := p.Services[k]
			if s == nil {
				continue
			}
			s = randomService(rng, 0)
			s.Key = k
			p.Services[k] = s
		default:
			if s := p.Services[k]; s != nil {
				s.Endpoints = randomEndpoints(rng)
			}
		}
		changed = append(changed, k)
	}
	return changed
}
