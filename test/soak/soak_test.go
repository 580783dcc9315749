package soak

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
weir_backend_commit_failures_total{mode="nftables"} 3
weir_plugin_failures_total{plugin="a"} 1
weir_plugin_failures_total{plugin="b"} 2
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m[mGoroutines] != 42 || m[mCommitFailed] != 3 || m[mPluginFailure] != 3 {
		t.Errorf("parsed %v", m)
	}
	if got := m.timestamp(mLastSync); !got.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("last sync %v", got)
	}
}

func TestParseSave(t *testing.T) {
	save := "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-ABC - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n" +
		"-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABC\nCOMMIT\n"
	chains, rules := parseSave(save)
	if !slices.Equal(chains, []string{"PREROUTING", "KUBE-SVC-ABC"}) || len(rules) != 2 {
		t.Errorf("chains %v, rules %v", chains, rules)
	}
}

// TestAllowed checks the pods a probe may reach: the ready ones, the
// serving terminating ones when none is ready, only local ones under a
// Local policy, only the destination's family.
func TestAllowed(t *testing.T) {
	v4 := dest{viaCluster, netip.MustParseAddrPort("10.96.0.1:80")}
	np := dest{viaNodePort, netip.MustParseAddrPort("172.30.0.1:30000")}
	v6 := dest{viaCluster, netip.MustParseAddrPort("[fd00:10:96::1]:80")}
	s := &service{slices: []*slice{
		{family: 4, eps: []endpoint{{pod: 0, state: epReady}, {pod: 1, state: epTermServing, local: true}, {pod: 2, state: epNotReady, local: true}}},
		{family: 6, eps: []endpoint{{pod: 3, state: epReady, local: true}}},
	}}
	tests := []struct {
		name     string
		itp, etp bool
		d        dest
		want     []int
	}{
		{"ready first", false, false, v4, []int{0}},
		{"local: the terminating one serves", true, false, v4, []int{1}},
		{"etp applies to node ports, not to cluster IPs", false, true, v4, []int{0}},
		{"node port under etp Local", false, true, np, []int{1}},
		{"IPv6", false, false, v6, []int{3}},
	}
	for _, tt := range tests {
		s.itpLocal, s.etpLocal = tt.itp, tt.etp
		var got []int
		for p := range s.allowed(tt.d) {
			got = append(got, p)
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: allowed %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestOlder(t *testing.T) {
	at := func(sec int64) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.Unix(sec, 0)}}
	}
	a := &service{ns: "a", name: "x", obj: at(10)}
	b := &service{ns: "b", name: "x", obj: at(20)}
	c := &service{ns: "c", name: "x", obj: at(10)}
	if !a.older(b) || b.older(a) || !a.older(c) || c.older(a) {
		t.Errorf("older: want a before b (time) and a before c (name)")
	}
}

func TestWindows(t *testing.T) {
	var w windows
	i := w.open("flush")
	now := time.Now()
	if got := w.openDuring(now, now); got != "flush" {
		t.Errorf("open window: %q", got)
	}
	w.close(i)
	later := time.Now().Add(time.Second)
	if got := w.openDuring(later, later); got != "" {
		t.Errorf("after the window closed: %q", got)
	}
	if got := w.openDuring(now.Add(-time.Second), later); got != "flush" {
		t.Errorf("an interval that overlaps it: %q", got)
	}
}
