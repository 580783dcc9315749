package proxy_test

import (
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/core/health"
	"github.com/weirproxy/weir/core/metrics"
	"github.com/weirproxy/weir/core/proxy"
)

// testClock is a clock the test moves by hand; the proxy reads it from
// its own goroutines too.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// observed is a proxy with real metrics and health state on a test clock.
type observed struct {
	p      *proxy.Proxy
	be     *fakeBackend
	m      *metrics.Metrics
	health *health.Proxy
	clock  *testClock
}

const healthTimeout = time.Minute

func newObserved(t *testing.T) *observed {
	t.Helper()
	o := &observed{be: newFakeBackend(), m: metrics.New("nftables"),
		clock: &testClock{t: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}}
	o.health = health.NewProxy(health.ProxyOptions{Timeout: healthTimeout, Now: o.clock.now})
	o.p = proxy.New(proxy.Options{NodeName: "n1", Backend: o.be, Metrics: o.m, Health: o.health, Now: o.clock.now,
		Log: slog.New(slog.DiscardHandler)})
	return o
}

// metric returns the one sample of a metric family: a counter's or gauge's
// value, or a histogram's count and sum; labels are name, value pairs.
func (o *observed) metric(t *testing.T, name string, labels ...string) (value float64, sum float64) {
	t.Helper()
	mfs, err := o.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), 0
			case m.Gauge != nil:
				return m.Gauge.GetValue(), 0
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), m.Histogram.GetSampleSum()
			}
		}
	}
	t.Fatalf("no metric %s %v", name, labels)
	return 0, 0
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}

func (o *observed) want(t *testing.T, step, name string, want float64, labels ...string) {
	t.Helper()
	if got, _ := o.metric(t, name, labels...); got != want {
		t.Errorf("%s: %s = %v, want %v", step, name, got, want)
	}
}

func TestMetricsFollowSyncs(t *testing.T) {
	o := newObserved(t)
	c := newCluster()
	c.feed(o.p)
	o.want(t, "before the first sync", "kubeproxy_sync_proxy_rules_service_changes_total", 2)
	o.want(t, "before the first sync", "kubeproxy_sync_proxy_rules_service_changes_pending", 2)
	o.want(t, "before the first sync", "kubeproxy_sync_proxy_rules_endpoint_changes_total", 1)
	o.want(t, "before the first sync", "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 1)
	o.want(t, "before the first sync", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", float64(o.clock.now().Unix()))

	o.clock.advance(time.Second)
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	step := "after a full sync"
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		o.want(t, step, "kubeproxy_sync_proxy_rules_duration_seconds", 1, "ip_family", f)
		o.want(t, step, "kubeproxy_sync_full_proxy_rules_duration_seconds", 1, "ip_family", f)
		o.want(t, step, "kubeproxy_sync_partial_proxy_rules_duration_seconds", 0, "ip_family", f)
		o.want(t, step, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", float64(o.clock.now().Unix()), "ip_family", f)
	}
	o.want(t, step, "kubeproxy_sync_proxy_rules_service_changes_pending", 0)
	o.want(t, step, "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0)

	// As in kube-proxy, a resync of an unchanged object (same
	// resourceVersion) counts as a change delivered, but none is pending.
	o.p.Handler().OnEndpointSlice(c.webEPs, c.webEPs)
	o.p.Handler().OnService(c.web, c.web)
	o.want(t, "after a resync", "kubeproxy_sync_proxy_rules_endpoint_changes_total", 2)
	o.want(t, "after a resync", "kubeproxy_sync_proxy_rules_service_changes_total", 3)
	o.want(t, "after a resync", "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0)
	o.want(t, "after a resync", "kubeproxy_sync_proxy_rules_service_changes_pending", 0)

	// Pending slice changes count changes, not services.
	one := withAddrs(c.webEPs, "10.244.0.11")
	o.p.Handler().OnEndpointSlice(c.webEPs, one)
	o.p.Handler().OnEndpointSlice(one, withAddrs(one, "10.244.0.12"))
	o.want(t, "after two slice changes", "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 2)
	if err := o.p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	step = "after a partial sync"
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		o.want(t, step, "kubeproxy_sync_proxy_rules_duration_seconds", 2, "ip_family", f)
		o.want(t, step, "kubeproxy_sync_partial_proxy_rules_duration_seconds", 1, "ip_family", f)
	}
	o.want(t, step, "kubeproxy_sync_proxy_rules_endpoint_changes_total", 4)
	o.want(t, step, "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0)

	// kube-proxy ignores FQDN slices and slices that name no service.
	fqdn := endpointSlice("web-fqdn", "web", c.webEPs.Ports)
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	unnamed := endpointSlice("orphan", "", c.webEPs.Ports, "10.244.0.13")
	delete(unnamed.Labels, discoveryv1.LabelServiceName)
	o.p.Handler().OnEndpointSlice(nil, fqdn)
	o.p.Handler().OnEndpointSlice(nil, unnamed)
	o.want(t, "after an FQDN and an unnamed slice", "kubeproxy_sync_proxy_rules_endpoint_changes_total", 4)
	o.want(t, "after an FQDN and an unnamed slice", "kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0)
	o.want(t, step, "weir_backend_commit_failures_total", 0, "mode", "nftables")

	o.be.failNextSync(errors.New("kernel says no"))
	o.p.Handler().OnService(c.db, nil)
	if err := o.p.Sync(t.Context(), false); err == nil {
		t.Fatal("Sync did not return the backend's error")
	}
	step = "after a failed sync"
	o.want(t, step, "weir_backend_commit_failures_total", 1, "mode", "nftables")
	o.want(t, step, "kubeproxy_sync_proxy_rules_duration_seconds", 2, "ip_family", metrics.IPv6)
}

func TestHealthFollowsSyncs(t *testing.T) {
	o := newObserved(t)
	c := newCluster()
	c.feed(o.p) // the initial listing queues the first sync
	o.clock.advance(healthTimeout)
	if o.health.Healthy() {
		t.Errorf("healthy with the first sync late by the timeout")
	}
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if st := o.health.Status(); !st.Healthy || !st.LastUpdated.Equal(o.clock.now()) {
		t.Errorf("after the sync: %+v, want healthy, updated now", st)
	}

	o.be.failNextSync(errors.New("kernel says no"))
	o.p.Handler().OnEndpointSlice(c.webEPs, withAddrs(c.webEPs, "10.244.0.11"))
	_ = o.p.Sync(t.Context(), false)
	o.clock.advance(healthTimeout - time.Second)
	if !o.health.Healthy() {
		t.Errorf("unhealthy before the timeout")
	}
	o.clock.advance(time.Second)
	if o.health.Healthy() {
		t.Errorf("healthy with a change waiting the timeout behind a failed sync")
	}
	if err := o.p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if !o.health.Healthy() {
		t.Errorf("unhealthy after the retry succeeded")
	}
}

func TestNetworkProgrammingLatency(t *testing.T) {
	o := newObserved(t)
	c := newCluster()
	start := o.clock.now()
	annotate := func(at time.Time, addrs ...string) {
		c.webEPs = withAddrs(c.webEPs, addrs...)
		c.webEPs.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
	}
	// A trigger time from before the proxy started is some earlier
	// proxy's business.
	annotate(start.Add(-time.Minute), "10.244.0.11", "10.244.0.13")
	c.feed(o.p)
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	o.want(t, "a slice changed before the start", "kubeproxy_network_programming_duration_seconds", 0)

	prev := c.webEPs
	annotate(start.Add(time.Second), "10.244.0.11")
	o.clock.advance(3 * time.Second)
	o.p.Handler().OnEndpointSlice(prev, c.webEPs)
	// The first commit fails: the change is not programmed yet.
	o.be.failNextSync(errors.New("kernel says no"))
	_ = o.p.Sync(t.Context(), false)
	o.want(t, "after a failed commit", "kubeproxy_network_programming_duration_seconds", 0)
	o.clock.advance(time.Second)
	if err := o.p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	n, sum := o.metric(t, "kubeproxy_network_programming_duration_seconds")
	if n != 1 || sum != 3 {
		t.Errorf("network programming: %v observations summing to %vs; want one of 3s (trigger at +1s, committed at +4s)", n, sum)
	}
	if err := o.p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if n, _ := o.metric(t, "kubeproxy_network_programming_duration_seconds"); n != 1 {
		t.Errorf("a later sync observed the change again: %v observations", n)
	}
}

func TestNodeEligibility(t *testing.T) {
	o := newObserved(t)
	h := o.p.Handler()
	deleting := node("n1")
	deleting.DeletionTimestamp = &metav1.Time{Time: o.clock.now()}
	tainted := node("n1")
	tainted.Spec.Taints = []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}
	otherTaint := node("n1")
	otherTaint.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}
	other := node("n2")
	other.DeletionTimestamp = deleting.DeletionTimestamp
	steps := []struct {
		name      string
		prev, cur *corev1.Node
		eligible  bool
	}{
		{"added", nil, node("n1"), true},
		{"being deleted", node("n1"), deleting, false},
		{"deletion cancelled", deleting, node("n1"), true},
		{"tainted by the autoscaler", node("n1"), tainted, false},
		{"another taint", tainted, otherTaint, true},
		{"another node being deleted", nil, other, true},
		{"deleted while being deleted", deleting, nil, false},
	}
	for _, s := range steps {
		h.OnNode(s.prev, s.cur)
		if got := o.health.Status().NodeEligible; got != s.eligible {
			t.Errorf("%s: node eligible %v, want %v", s.name, got, s.eligible)
		}
	}
}
