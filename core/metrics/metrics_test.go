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

// families lists every metric family the registry gathers, by name.
func families(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetType().String()
	}
	return out
}

func TestRegistration(t *testing.T) {
	m := New("nftables")
	m.PluginCalled("p", time.Millisecond, nil)
	m.PluginQuarantined("p", false)
	m.Probe("/healthz", 200)
	m.Probe("/livez", 200)
	got := families(t, m)
	want := map[string]string{
		"kubeproxy_sync_proxy_rules_duration_seconds":              "HISTOGRAM",
		"kubeproxy_sync_full_proxy_rules_duration_seconds":         "HISTOGRAM",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds":      "HISTOGRAM",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        "GAUGE",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "GAUGE",
		"kubeproxy_network_programming_duration_seconds":           "HISTOGRAM",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":        "COUNTER",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      "GAUGE",
		"kubeproxy_sync_proxy_rules_service_changes_total":         "COUNTER",
		"kubeproxy_sync_proxy_rules_service_changes_pending":       "GAUGE",
		"kubeproxy_proxy_healthz_total":                            "COUNTER",
		"kubeproxy_proxy_livez_total":                              "COUNTER",
		"weir_backend_commit_failures_total":                       "COUNTER",
		"weir_plugin_calls_total":                                  "COUNTER",
		"weir_plugin_failures_total":                               "COUNTER",
		"weir_plugin_call_duration_seconds":                        "HISTOGRAM",
		"weir_plugin_quarantined":                                  "GAUGE",
		"go_goroutines":                                            "GAUGE",
	}
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("%s: type %q, want %q", name, got[name], typ)
		}
	}
	// The process collector reads /proc; it exists wherever Weir runs.
	if _, ok := got["process_start_time_seconds"]; !ok {
		t.Errorf("no process_start_time_seconds; families: %v", got)
	}
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
	m.NetworkProgrammed(1500 * time.Millisecond)
	m.CommitFailed()
	m.PluginCalled("affinity", time.Millisecond, nil)
	m.PluginCalled("affinity", time.Millisecond, errors.New("trap"))
	m.PluginQuarantined("affinity", true)

	counts := map[string]int{
		"kubeproxy_sync_proxy_rules_duration_seconds":         3,
		"kubeproxy_sync_full_proxy_rules_duration_seconds":    1,
		"kubeproxy_sync_partial_proxy_rules_duration_seconds": 2,
		"kubeproxy_network_programming_duration_seconds":      1,
	}
	text := scrape(t, m)
	for name, n := range counts {
		if want := name + "_count " + strconv.Itoa(n); !strings.Contains(text, want) {
			t.Errorf("want %q in the scrape", want)
		}
	}
	values := []struct {
		got, want float64
		name      string
	}{
		{testutil.ToFloat64(m.lastSync), 1700000000.5, "last timestamp"},
		{testutil.ToFloat64(m.lastQueued), 1700000001.5, "last queued timestamp"},
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
		found := strings.Contains(text, "kubeproxy_network_programming_duration_seconds_bucket{"+le+"}")
		if found != (le != `le="1.5"`) {
			t.Errorf("network programming bucket %s present: %v", le, found)
		}
	}
	if !strings.Contains(text, `kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="16.384"}`) {
		t.Errorf("sync duration lacks kube-proxy's last bucket 16.384")
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
