package kubeproxy

import (
	"strings"
	"testing"
)

// sample is kube-proxy's metrics text, cut to what Snapshot reads.
const sample = `# TYPE kubeproxy_sync_proxy_rules_service_changes_total counter
kubeproxy_sync_proxy_rules_service_changes_total 6
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter
kubeproxy_sync_proxy_rules_endpoint_changes_total 2
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 0
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 0
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7647765305123456e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7647765305223456e+09
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7647765304123456e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.7647765304123456e+09
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.03
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 2
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.02
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2
`

func TestParseSnapshot(t *testing.T) {
	s, err := parseSnapshot(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if s.ServiceChanges != 6 || s.SliceChanges != 2 || len(s.Families) != 2 {
		t.Fatalf("parsed %s", s)
	}
	v4 := s.Families["IPv4"]
	if v4.Syncs != 3 || v4.LastSync != 1.7647765305123456e+09 || v4.LastQueued != 1.7647765304123456e+09 {
		t.Errorf("IPv4: %+v", v4)
	}
}

// TestSettled checks each condition of a settled proxy on its own: every
// one, broken alone, keeps the proxy unsettled.
func TestSettled(t *testing.T) {
	mark, err := parseSnapshot(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	now := func() Snapshot {
		s, _ := parseSnapshot(strings.NewReader(sample))
		s.ServiceChanges += 2
		s.SliceChanges++
		return s
	}
	want := Changes{Services: 1, Slices: 1}
	if !now().settled(mark, want) {
		t.Fatalf("%s: not settled", now())
	}
	broken := map[string]func(s *Snapshot, w *Changes){
		"slice event not yet received": func(s *Snapshot, w *Changes) { w.Slices = 2 },
		"service change pending":       func(s *Snapshot, w *Changes) { s.ServicePending = 1 },
		"slice change pending":         func(s *Snapshot, w *Changes) { s.SlicePending = 1 },
		"a sync running":               func(s *Snapshot, w *Changes) { s.InFlight = 1 },
		"a sync asked for after the last one": func(s *Snapshot, w *Changes) {
			f := s.Families["IPv6"]
			f.LastQueued = f.LastSync + 0.001
			s.Families["IPv6"] = f
		},
		"the zone change not yet queued": func(s *Snapshot, w *Changes) { w.Node = true },
		"no family synced yet":           func(s *Snapshot, w *Changes) { s.Families = map[string]Family{} },
	}
	for name, brk := range broken {
		s, w := now(), want
		brk(&s, &w)
		if s.settled(mark, w) {
			t.Errorf("%s: settled", name)
		}
	}
}
