package compare

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/weirproxy/weir/test/kubeproxy"
)

// fullSyncMetric is the histogram of full syncs both proxies keep, by
// ip_family.
const fullSyncMetric = "kubeproxy_sync_full_proxy_rules_duration_seconds"

// fullSyncs reads the IPv4 full-sync histogram from the proxy's metrics
// server through c: how many full syncs ended and their total duration.
func fullSyncs(ctx context.Context, c *http.Client) (uint64, time.Duration, error) {
	url := "http://" + kubeproxy.MetricsAddress + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseFullSyncs(resp.Body)
}

// parseFullSyncs reads fullSyncMetric's IPv4 series from the Prometheus
// text format.
func parseFullSyncs(r io.Reader) (uint64, time.Duration, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return 0, 0, fmt.Errorf("parse metrics: %w", err)
	}
	for _, m := range mfs[fullSyncMetric].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "ip_family" && l.GetValue() == "IPv4" {
				h := m.GetHistogram()
				return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second)), nil
			}
		}
	}
	return 0, 0, nil
}

// idle reports whether a proxy's metrics show nothing left to do: no
// change pending, no sync running or asked for since the last one ended.
func idle(s kubeproxy.Snapshot) bool {
	if s.ServicePending != 0 || s.SlicePending != 0 || s.InFlight != 0 || len(s.Families) == 0 {
		return false
	}
	for _, f := range s.Families {
		if f.LastSync == 0 || f.LastQueued > f.LastSync {
			return false
		}
	}
	return true
}

// sameSyncs reports whether two readings show the same syncs and changes.
func sameSyncs(a, b kubeproxy.Snapshot) bool {
	if a.ServiceChanges != b.ServiceChanges || a.SliceChanges != b.SliceChanges || len(a.Families) != len(b.Families) {
		return false
	}
	for k, f := range a.Families {
		if b.Families[k] != f {
			return false
		}
	}
	return true
}

// lastSync is when the proxy's latest sync of any family ended.
func lastSync(s kubeproxy.Snapshot) time.Time {
	var last float64
	for _, f := range s.Families {
		last = max(last, f.LastSync)
	}
	sec := int64(last)
	return time.Unix(sec, int64((last-float64(sec))*1e9))
}
