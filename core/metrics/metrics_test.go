package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gathered lists every metric family the registry gathers, by name: its
// type and the label names of its first series.
func gathered(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		var labels []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		out[mf.GetName()] = mf.GetType().String() + strings.Join(append([]string{""}, labels...), " ")
	}
	return out
}

// commonFamilies are the families of every mode once each has a series,
// with their types and label names as kube-proxy v1.37 has them.
var commonFamilies = map[string]string{
	"kubeproxy_sync_proxy_rules_duration_seconds":              "HISTOGRAM ip_family",
	"kubeproxy_sync_full_proxy_rules_duration_seconds":         "HISTOGRAM ip_family",
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":      "HISTOGRAM ip_family",
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        "GAUGE ip_family",
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "GAUGE ip_family",
	"kubeproxy_network_programming_duration_seconds":           "HISTOGRAM ip_family",
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":        "COUNTER",
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      "GAUGE",
	"kubeproxy_sync_proxy_rules_service_changes_total":         "COUNTER",
	"kubeproxy_sync_proxy_rules_service_changes_pending":       "GAUGE",
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      "GAUGE ip_family traffic_policy",
	"kubeproxy_conntrack_reconciler_sync_duration_seconds":     "HISTOGRAM ip_family",
	"kubeproxy_conntrack_reconciler_deleted_entries_total":     "COUNTER ip_family",
	"kubeproxy_proxy_healthz_total":                            "COUNTER code",
	"kubeproxy_proxy_livez_total":                              "COUNTER code",
	"weir_backend_commit_failures_total":                       "COUNTER mode",
	"weir_plugin_calls_total":                                  "COUNTER plugin",
	"weir_plugin_failures_total":                               "COUNTER plugin",
	"weir_plugin_call_duration_seconds":                        "HISTOGRAM plugin",
	"weir_plugin_quarantined":                                  "GAUGE plugin",
	"weir_plugin_pull_failures_total":                          "COUNTER plugin",
	"weir_signals_read_duration_seconds":                       "HISTOGRAM",
	"weir_signals_read_failures_total":                         "COUNTER",
	"weir_signals_moved_services_total":                        "COUNTER",
	"go_goroutines":                                            "GAUGE",
}

// modeFamilies are the families only one mode registers.
var modeFamilies = map[string]map[string]string{
	"iptables": {
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         "COUNTER ip_family",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "COUNTER ip_family",
		"kubeproxy_sync_proxy_rules_iptables_total":                          "GAUGE ip_family table",
		"kubeproxy_sync_proxy_rules_iptables_last":                           "GAUGE ip_family table",
	},
	"nftables": {
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":    "COUNTER ip_family",
		"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": "COUNTER ip_family",
	},
	"ipvs": {},
}

// TestRegistration gives every series of each mode a value and checks the
// families: names, types and labels, those of the mode and no other's.
func TestRegistration(t *testing.T) {
	for mode, own := range modeFamilies {
		t.Run(mode, func(t *testing.T) {
			m := New(mode)
			touchAll(m)
			got := gathered(t, m)
			for name, want := range commonFamilies {
				if got[name] != want {
					t.Errorf("%s: %q, want %q", name, got[name], want)
				}
			}
			for other, families := range modeFamilies {
				for name, want := range families {
					if other != mode {
						want = ""
					}
					if got[name] != want {
						t.Errorf("%s: %q, want %q", name, got[name], want)
					}
				}
			}
			if len(got) < len(commonFamilies)+len(own) {
				t.Errorf("%d families, want at least %d: %v", len(got), len(commonFamilies)+len(own), got)
			}
			// The process collector reads /proc; it exists wherever Weir runs.
			if _, ok := got["process_start_time_seconds"]; !ok {
				t.Errorf("no process_start_time_seconds; families: %v", got)
			}
		})
	}
}

// touchAll calls every update method once.
func touchAll(m *Metrics) {
	m.Synced(true, time.Millisecond, time.Now())
	m.Synced(false, time.Millisecond, time.Now())
	m.Queued(time.Now())
	m.NetworkProgrammed(IPv4, time.Second)
	m.NoLocalEndpoints(IPv4, "internal", 0)
	m.Reconciled(IPv4, time.Millisecond, 0)
	m.BackendFailed(IPv4, 0, 0)
	m.BackendRules(IPv4, "nat", 10, 2)
	m.PluginCalled("p", time.Millisecond, nil)
	m.PluginQuarantined("p", false)
	m.PluginPullFailed("p", errors.New("registry down"))
	m.Probe("/healthz", 200)
	m.Probe("/livez", 200)
}

func TestUpdates(t *testing.T) {
	m := New("iptables")
	end := time.Unix(1700000000, 500_000_000)
	m.Synced(true, 20*time.Millisecond, end)
	m.Synced(false, 2*time.Millisecond, end)
	m.Synced(false, 3*time.Millisecond, end)
	m.Queued(end.Add(time.Second))
	m.ServiceChanged()
	m.EndpointsChanged()
	m.EndpointsChanged()
	m.Pending(1, 2)
	m.NetworkProgrammed(IPv6, 1500*time.Millisecond)
	m.CommitFailed()
	m.PluginCalled("affinity", time.Millisecond, nil)
	m.PluginCalled("affinity", time.Millisecond, errors.New("trap"))
	m.PluginQuarantined("affinity", true)

	text := scrape(t, m)
	// One sync serves both families: each sees every observation.
	counts := map[string]int{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:         3,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"}`:         3,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:    1,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"}`:    1,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`: 2,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"}`: 2,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"}`:      1,
	}
	for series, n := range counts {
		if want := series + " " + strconv.Itoa(n); !strings.Contains(text, want) {
			t.Errorf("want %q in the scrape", want)
		}
	}
	if !strings.Contains(text, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 0`) {
		t.Errorf("an IPv6 slice's latency shows in the IPv4 series, or that series is missing")
	}
	values := []struct {
		got, want float64
		name      string
	}{
		{testutil.ToFloat64(m.lastSync.WithLabelValues(IPv4)), 1700000000.5, "last timestamp"},
		{testutil.ToFloat64(m.lastSync.WithLabelValues(IPv6)), 1700000000.5, "last timestamp IPv6"},
		{testutil.ToFloat64(m.lastQueued.WithLabelValues(IPv6)), 1700000001.5, "last queued timestamp"},
		{testutil.ToFloat64(m.serviceChanges), 1, "service changes"},
		{testutil.ToFloat64(m.endpointChanges), 2, "endpoint changes"},
		{testutil.ToFloat64(m.servicePending), 1, "service changes pending"},
		{testutil.ToFloat64(m.endpointPending), 2, "endpoint changes pending"},
		{testutil.ToFloat64(m.commitFailures.WithLabelValues("iptables")), 1, "commit failures"},
		{testutil.ToFloat64(m.pluginCalls.WithLabelValues("affinity")), 2, "plugin calls"},
		{testutil.ToFloat64(m.pluginFailures.WithLabelValues("affinity")), 1, "plugin failures"},
		{testutil.ToFloat64(m.pluginQuarantined.WithLabelValues("affinity")), 1, "plugin quarantined"},
	}
	for _, v := range values {
		if v.got != v.want {
			t.Errorf("%s = %v, want %v", v.name, v.got, v.want)
		}
	}
	// The network programming histogram has kube-proxy's buckets.
	for _, le := range []string{`le="0.25"`, `le="1.5"`, `le="59"`, `le="115"`, `le="300"`} {
		found := strings.Contains(text, `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",`+le+"}")
		if found != (le != `le="1.5"`) {
			t.Errorf("network programming bucket %s present: %v", le, found)
		}
	}
	if !strings.Contains(text, `kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"}`) {
		t.Errorf("sync duration lacks kube-proxy's last bucket 16.384")
	}
}

// TestBackendFigures records the backend's figures in each mode: in mode
// iptables they are the restore failures and rule counts, in mode nftables
// the sync failures, and mode ipvs has neither; the failure counters show
// 0 in both families from the start.
func TestBackendFigures(t *testing.T) {
	ipt := New("iptables")
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv6"} 0`,
		`kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 0`,
	} {
		if !strings.Contains(scrape(t, ipt), want) {
			t.Errorf("a new registry lacks %q", want)
		}
	}
	ipt.BackendFailed(IPv4, 2, 1)
	ipt.BackendFailed(IPv4, 1, 0)
	ipt.BackendRules(IPv6, "nat", 120, 7)
	ipt.BackendRules(IPv6, "nat", 118, 3)
	for _, v := range []struct {
		got, want float64
		name      string
	}{
		{testutil.ToFloat64(ipt.backendFailures.WithLabelValues(IPv4)), 3, "restore failures"},
		{testutil.ToFloat64(ipt.partialFailures.WithLabelValues(IPv4)), 1, "partial restore failures"},
		{testutil.ToFloat64(ipt.backendFailures.WithLabelValues(IPv6)), 0, "IPv6 restore failures"},
		{testutil.ToFloat64(ipt.rulesTotal.WithLabelValues("nat", IPv6)), 118, "rules total"},
		{testutil.ToFloat64(ipt.rulesLast.WithLabelValues("nat", IPv6)), 3, "rules last"},
	} {
		if v.got != v.want {
			t.Errorf("iptables: %s = %v, want %v", v.name, v.got, v.want)
		}
	}

	nft := New("nftables")
	nft.BackendFailed(IPv6, 1, 1)
	nft.BackendRules(IPv6, "nat", 5, 5)
	text := scrape(t, nft)
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv6"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("nftables: no %q in the scrape", want)
		}
	}
	if strings.Contains(text, "iptables") {
		t.Errorf("nftables: the scrape has iptables metrics")
	}

	ipvs := New("ipvs")
	ipvs.BackendFailed(IPv4, 1, 1)
	ipvs.BackendRules(IPv4, "nat", 5, 5)
	if text := scrape(t, ipvs); strings.Contains(text, "tables_") {
		t.Errorf("ipvs: the scrape has backend figures")
	}
}

// TestNoLocalAndReconciler sets the no-local-endpoints gauge and records
// two reconciler passes.
func TestNoLocalAndReconciler(t *testing.T) {
	m := New("nftables")
	m.NoLocalEndpoints(IPv4, "external", 3)
	m.NoLocalEndpoints(IPv4, "external", 2)
	m.NoLocalEndpoints(IPv6, "internal", 1)
	m.Reconciled(IPv4, 3*time.Millisecond, 4)
	m.Reconciled(IPv4, 5*time.Millisecond, 1)
	m.Reconciled(IPv6, 5*time.Millisecond, 0)
	text := scrape(t, m)
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 2`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 1`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 5`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 0`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} 2`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv6",le="16.384"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the scrape", want)
		}
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	code, body := get(t, m.Handler(), "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	return body
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func TestHandler(t *testing.T) {
	m := New("ipvs")
	h := m.Handler()
	if code, body := get(t, h, "/proxyMode"); code != http.StatusOK || body != "ipvs" {
		t.Errorf("/proxyMode: %d %q, want 200 %q", code, body, "ipvs")
	}
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz: %d %q, want 200 ok", code, body)
	}
	if code, _ := get(t, h, "/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing: %d, want 404", code)
	}
	text := scrape(t, m)
	for _, want := range []string{`weir_backend_commit_failures_total{mode="ipvs"} 0`, "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram"} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
