package compare

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weirproxy/weir/test/kubeproxy"
)

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes(" 1000x10, 10000×10,5000x50 ")
	if err != nil {
		t.Fatal(err)
	}
	want := []Size{{1000, 10}, {10000, 10}, {5000, 50}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("size %d: got %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"1000", "x10", "1000x", "0x10", "70000x10", "10x1001", "10x10,10x10", "ax1"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q): no error", bad)
		}
	}
	if s, err := ParseSizes(""); err != nil || len(s) != 0 {
		t.Errorf("ParseSizes(\"\") = %v, %v; want nothing", s, err)
	}
}

func TestParseList(t *testing.T) {
	if got, err := ParseList("nftables, ipvs", "mode", Modes); err != nil || strings.Join(got, ",") != "nftables,ipvs" {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "nft", "ipvs,ipvs"} {
		if _, err := ParseList(bad, "mode", Modes); err == nil {
			t.Errorf("ParseList(%q): no error", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	c := Defaults()
	c.Weir, c.KubeProxy, c.Dir = "weir", "kube-proxy", "/tmp/x"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	c.ZeroSizes = []Size{{7, 7}}
	c.Changes = 0
	c.Cap = time.Second
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"7x7", "changes 0", "cap 1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestSettingsAndTargets(t *testing.T) {
	c := Defaults()
	if got := c.settings(Size{10000, 10}); len(got) != 2 || got[0] != time.Second || got[1] != 0 {
		t.Errorf("settings at 10k: %v", got)
	}
	if got := c.settings(Size{1000, 10}); len(got) != 1 {
		t.Errorf("settings at 1k: %v", got)
	}
	if got := c.targets("ipvs"); len(got) != 1 || got[0].Proxy != Weir {
		t.Errorf("ipvs targets: %v", got)
	}
	if got := c.targets("iptables-legacy"); len(got) != 2 || got[0].Proxy != KubeProxy ||
		got[0].kernelMode() != "iptables" || got[0].flavour() != "legacy" {
		t.Errorf("iptables-legacy targets: %v", got)
	}
	order := c.orderedSizes()
	if order[0] != (Size{1000, 10}) || order[3] != (Size{30000, 10}) || order[2] != (Size{5000, 50}) {
		t.Errorf("order %v", order)
	}
}

func TestLoadServicesFitTheNodePortRange(t *testing.T) {
	svcs, err := loadServices(Size{30000, 10})
	if err != nil {
		t.Fatal(err)
	}
	ports, local, lb := 0, 0, 0
	for _, s := range svcs {
		ports += nodePortsNeeded(s)
		if s.Spec.ClusterIP != "" || s.Namespace != loadNamespace {
			t.Fatalf("%s: cluster IP %q, namespace %q", s.Name, s.Spec.ClusterIP, s.Namespace)
		}
		if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			local++
		}
		if len(s.Status.LoadBalancer.Ingress) > 0 {
			lb++
		}
	}
	if ports > nodePorts {
		t.Errorf("%d node ports needed; the range has %d", ports, nodePorts)
	}
	if lb != 6000 || local == 0 {
		t.Errorf("%d load balancers with an ingress IP (want 6000), %d with policy Local", lb, local)
	}
	// At 1k nothing is downgraded: test/scale's mix as it is.
	small, err := loadServices(Size{1000, 10})
	if err != nil {
		t.Fatal(err)
	}
	types := map[corev1.ServiceType]int{}
	for _, s := range small {
		types[s.Spec.Type]++
	}
	if types[corev1.ServiceTypeNodePort] != 300 || types[corev1.ServiceTypeLoadBalancer] != 200 {
		t.Errorf("types at 1k: %v", types)
	}
}

func TestLoadSlice(t *testing.T) {
	seen := map[netip.Addr]bool{}
	for i := range 3 {
		s := loadSlice(i, 50, 0, false)
		if len(s.Endpoints) != 50 {
			t.Fatalf("%d endpoints", len(s.Endpoints))
		}
		for _, e := range s.Endpoints {
			a := netip.MustParseAddr(e.Addresses[0])
			if seen[a] {
				t.Errorf("address %s twice", a)
			}
			seen[a] = true
		}
	}
	a, b := loadSlice(7, 10, 0, false), loadSlice(7, 10, 3, true)
	if _, ok := b.Labels[corev1.IsHeadlessService]; !ok || len(a.Labels) != 1 {
		t.Errorf("labels %v and %v: want the headless label on the hidden slice only", a.Labels, b.Labels)
	}
	for j := range a.Endpoints {
		same := a.Endpoints[j].Addresses[0] == b.Endpoints[j].Addresses[0]
		if same != (j != 0) {
			t.Errorf("endpoint %d: %s then %s", j, a.Endpoints[j].Addresses[0], b.Endpoints[j].Addresses[0])
		}
	}
}

func TestStride(t *testing.T) {
	for _, n := range []int{1, 2, 7919, 10000, 15838, 30000} {
		s := stride(n)
		seen := map[int]bool{}
		for k := range n {
			seen[k*s%n] = true
		}
		if len(seen) != n {
			t.Errorf("stride %d visits %d of %d services", s, len(seen), n)
		}
	}
}

func TestParseCPU(t *testing.T) {
	line := "1234 (kube proxy) (x) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 7 3 20 0 12 0 100 1000 200"
	got, err := parseCPU(line)
	if err != nil || got != 210*clockTick {
		t.Errorf("parseCPU = %v, %v; want %v", got, err, 210*clockTick)
	}
	if _, err := parseCPU("1234 (x) S 1"); err == nil {
		t.Error("short line: no error")
	}
}

func TestStatusField(t *testing.T) {
	status := "Name:\tweir\nVmHWM:\t  327680 kB\nVmRSS:\t  102400 kB\n"
	if got := statusField(status, "VmHWM:"); got != 327680<<10 {
		t.Errorf("VmHWM %d", got)
	}
	if got := statusField(status, "VmSwap:"); got != 0 {
		t.Errorf("VmSwap %d", got)
	}
}

func TestCountJSON(t *testing.T) {
	js := `{"nftables": [{"metainfo": {"version": "1.1.3"}},
	{"table": {"family": "ip", "name": "kube-proxy"}},
	{"chain": {"family": "ip", "table": "kube-proxy", "name": "a"}},
	{"chain": {"family": "ip", "table": "kube-proxy", "name": "b"}},
	{"set": {"name": "cluster-ips", "elem": ["10.96.0.1", "10.96.0.2"]}},
	{"map": {"name": "service-ips", "elem": [[{"concat": ["10.96.0.1", "tcp", 443]}, {"goto": {"target": "a"}}]]}},
	{"set": {"name": "empty"}},
	{"rule": {"chain": "a", "expr": []}}]}`
	got, err := countJSON(strings.NewReader(js))
	want := Counts{Tables: 1, Chains: 2, Rules: 1, Elements: 3}
	if err != nil || got != want {
		t.Errorf("countJSON = %+v, %v; want %+v", got, err, want)
	}
	if got, err := countJSON(strings.NewReader("")); err != nil || got != (Counts{}) {
		t.Errorf("empty ruleset: %+v, %v", got, err)
	}
	if _, err := countJSON(strings.NewReader(`{"other": []}`)); err == nil {
		t.Error("not nft JSON: no error")
	}
}

func TestCountSave(t *testing.T) {
	save := "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"
	if got := countSave(strings.NewReader(save)); got != (Counts{Tables: 2, Chains: 3, Rules: 1}) {
		t.Errorf("countSave = %+v", got)
	}
}

func TestParseFullSyncs(t *testing.T) {
	text := `# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 3.5
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.1
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
`
	n, sum, err := parseFullSyncs(strings.NewReader(text))
	if err != nil || n != 2 || sum != 3500*time.Millisecond {
		t.Errorf("parseFullSyncs = %d, %v, %v", n, sum, err)
	}
	if n, _, err := parseFullSyncs(strings.NewReader("")); err != nil || n != 0 {
		t.Errorf("no metric: %d, %v", n, err)
	}
}

func TestIdle(t *testing.T) {
	fam := func(last, queued float64) map[string]kubeproxy.Family {
		return map[string]kubeproxy.Family{"IPv4": {LastSync: last, LastQueued: queued, Syncs: 3}}
	}
	for _, c := range []struct {
		name string
		s    kubeproxy.Snapshot
		want bool
	}{
		{"idle", kubeproxy.Snapshot{Families: fam(10, 9)}, true},
		{"queued after the last sync", kubeproxy.Snapshot{Families: fam(10, 11)}, false},
		{"never synced", kubeproxy.Snapshot{Families: fam(0, 0)}, false},
		{"pending", kubeproxy.Snapshot{Families: fam(10, 9), SlicePending: 1}, false},
		{"in flight", kubeproxy.Snapshot{Families: fam(10, 9), InFlight: 1}, false},
		{"no families", kubeproxy.Snapshot{}, false},
	} {
		if got := idle(c.s); got != c.want {
			t.Errorf("%s: idle = %v", c.name, got)
		}
	}
	a := kubeproxy.Snapshot{Families: fam(10, 9), SliceChanges: 4}
	b := a
	b.Families = fam(10, 9)
	if !sameSyncs(a, b) {
		t.Error("equal snapshots differ")
	}
	b.Families = fam(12, 9)
	if sameSyncs(a, b) {
		t.Error("a later sync went unseen")
	}
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	for q, want := range map[float64]time.Duration{0.5: 3, 0.99: 5, 1: 5, 0: 1} {
		if got := quantile(ds, q); got != want {
			t.Errorf("quantile %g = %v, want %v", q, got, want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing")
	}
}

func TestCappedBefore(t *testing.T) {
	kp := Target{KubeProxy, "iptables-nft"}
	results := []Result{{Target: kp, Size: Size{10000, 10}, Capped: "first sync"}}
	if cappedBefore(results, kp, Size{30000, 10}) == nil {
		t.Error("30k not skipped after 10k passed the cap")
	}
	if cappedBefore(results, kp, Size{5000, 50}) != nil {
		t.Error("5k x 50 skipped: it has fewer services")
	}
	if cappedBefore(results, Target{Weir, "iptables-nft"}, Size{30000, 10}) != nil {
		t.Error("another target skipped")
	}
}

func TestMarkdown(t *testing.T) {
	size := Size{10000, 10}
	kp := Target{KubeProxy, "nftables"}
	w := Target{Weir, "nftables"}
	full := func(t Target, scale time.Duration) Result {
		return Result{Target: t, Size: size, MinSync: time.Second,
			FirstSync: 16 * scale, FullSync: 8 * scale, Changes: []time.Duration{scale / 2, scale},
			Churn: []time.Duration{scale, 2 * scale}, PeakRSS: 300 << 20, SteadyRSS: 200 << 20,
			CPUTotal: 10 * scale, CPUChurn: scale, Kernel: &Counts{Rules: 1000, Chains: 100, Elements: 10}}
	}
	rep := &Report{
		Results: []Result{
			full(kp, time.Second), full(w, 100*time.Millisecond),
			{Target: Target{KubeProxy, "iptables-nft"}, Size: size, MinSync: time.Second, Capped: "first sync", PeakRSS: 1 << 30},
			full(Target{Weir, "iptables-nft"}, 100*time.Millisecond),
			{Target: Target{Weir, "ipvs"}, Size: size, MinSync: time.Second, Skipped: "no IPVS"},
		},
		Loads: []Load{{Size: size, Writes: 22000, Took: 20 * time.Second, Created: 10000}},
	}
	md := rep.Markdown("Measured here.", 20*time.Minute)
	for _, want := range []string{
		"Measured here.",
		"| 10000 × 10 | 1s | nftables | kube-proxy | 16 s | 8 s | 500 ms | 1 s | 1 s | 2 s | 2 s | 300 MiB | 200 MiB | 10 s | 1 s | 1000 | 100 | 10 |",
		"|  |  |  | Weir | 1.6 s | 800 ms | 50 ms |",
		"|  |  |  | Weir / kube-proxy | 0.1 | 0.1 | 0.1 | 0.1 | 0.1 | 0.1 | 0.1 | 1 | 1 | 0.1 | 0.1 | 1 | 1 | 1 |",
		"| 10000 × 10 | 1s | iptables-nft | kube-proxy | > cap | > cap |",
		"1024 MiB at cap",
		"| Weir / kube-proxy | < 0.0013 | < 0.001 | < 0.001 |",
		"| 10000 × 10 | 1s | ipvs | Weir | – |",
		"- Load 10000 × 10: 22000 API writes in 20 s (1100/s): 10000 services created, 0 hidden, 0 shown again, 0 slices rewritten.",
		"Weir, ipvs, 10000 × 10, minSyncPeriod 1s: not run: no IPVS.",
		"passed the cap during first sync",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}

func TestMissing(t *testing.T) {
	r := Result{FirstSync: 1, FullSync: 1, Changes: []time.Duration{1}, Churn: []time.Duration{1},
		PeakRSS: 1, SteadyRSS: 1, CPUTotal: 1, Kernel: &Counts{Rules: 1}}
	if m := r.Missing(); len(m) != 0 {
		t.Errorf("complete result misses %v", m)
	}
	r.Churn, r.Kernel = nil, nil
	if m := r.Missing(); strings.Join(m, ",") != "churn latency,kernel objects" {
		t.Errorf("missing %v", m)
	}
}

func TestResize(t *testing.T) {
	client := fake.NewClientset()
	w := &writer{client: client, workers: 4}
	var c cluster
	ctx := context.Background()
	for _, step := range []struct {
		size                              Size
		created, hidden, shown, rewritten int64
	}{
		{Size{4, 2}, 4, 0, 0, 0},
		{Size{6, 2}, 2, 0, 0, 0},
		{Size{3, 5}, 0, 3, 0, 3},
		{Size{8, 2}, 2, 0, 3, 3},
	} {
		var ch loadChanges
		if err := w.resize(ctx, &c, step.size, &ch); err != nil {
			t.Fatalf("%s: %v", step.size, err)
		}
		got := [4]int64{ch.created.Load(), ch.hidden.Load(), ch.shown.Load(), ch.rewritten.Load()}
		if want := [4]int64{step.created, step.hidden, step.shown, step.rewritten}; got != want {
			t.Errorf("%s: created, hidden, shown, rewritten = %v, want %v", step.size, got, want)
		}
		checkCluster(t, client, step.size, len(c.eps))
	}
}

// checkCluster checks that the API holds n services of which size's are
// visible with size.Endpoints endpoints and the others hidden.
func checkCluster(t *testing.T, client *fake.Clientset, size Size, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		svc, err := client.CoreV1().Services(loadNamespace).Get(ctx, fmt.Sprintf("svc-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		slice, err := client.DiscoveryV1().EndpointSlices(loadNamespace).Get(ctx, fmt.Sprintf("svc-%d-abcde", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, svcHidden := svc.Labels[labelServiceProxyName]
		_, sliceHidden := slice.Labels[corev1.IsHeadlessService]
		visible := i < size.Services
		if svcHidden == visible || sliceHidden == visible {
			t.Errorf("%s: service %d hidden %v, its slice %v; want %v", size, i, svcHidden, sliceHidden, !visible)
		}
		if visible && len(slice.Endpoints) != size.Endpoints {
			t.Errorf("%s: service %d has %d endpoints", size, i, len(slice.Endpoints))
		}
	}
}

func TestCommitted(t *testing.T) {
	for _, c := range []struct {
		pod  string
		k    int
		want bool
	}{
		{"p5", 5, true}, {"p6", 5, true}, {"p0", 5, true}, {"p4", 5, false}, {"p1", 5, false},
		{"p0", 0, true}, {"p3", 0, true}, {"p4", 0, false}, {"p7", 0, false},
		{"p1", 9, true}, {"p0", 9, false}, {"pa", 5, false}, {"p9", 5, false},
	} {
		if got := committed(c.pod, c.k); got != c.want {
			t.Errorf("committed(%q, %d) = %v, want %v", c.pod, c.k, got, c.want)
		}
	}
}
