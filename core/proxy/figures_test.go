package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/metrics"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/sdk/plan"
)

// reportingBackend is a fakeBackend that reports figures: each Sync's
// Report is the next of reports (the zero Report once they run out).
type reportingBackend struct {
	*fakeBackend
	reports []backends.Report
	last    backends.Report
}

func (b *reportingBackend) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	b.last = backends.Report{}
	if len(b.reports) > 0 {
		b.last, b.reports = b.reports[0], b.reports[1:]
	}
	return b.fakeBackend.Sync(ctx, p, req)
}

func (b *reportingBackend) Report() backends.Report { return b.last }

// TestBackendFigures hands the metrics of mode iptables the figures of a
// reporting backend after each Sync: the failures of a Sync that failed
// too, the rule counts of one that succeeded.
func TestBackendFigures(t *testing.T) {
	be := &reportingBackend{fakeBackend: newFakeBackend(), reports: []backends.Report{
		{Families: []backends.FamilyReport{
			{Family: backends.IPv4, Tables: map[string]backends.Rules{"nat": {Total: 40, Written: 40}, "filter": {Total: 5, Written: 5}}},
			{Family: backends.IPv6, Tables: map[string]backends.Rules{"nat": {Total: 9, Written: 9}}},
		}},
		{Families: []backends.FamilyReport{{Family: backends.IPv4, Failed: 2, FailedPartial: 1}, {Family: backends.IPv6}}},
		{Families: []backends.FamilyReport{
			{Family: backends.IPv4, Failed: 1, Tables: map[string]backends.Rules{"nat": {Total: 44, Written: 44}}},
		}},
	}}
	m := metrics.New("iptables")
	o := &observed{m: m}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: be, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	c := newCluster()
	c.feed(p)
	if err := p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	const total, last = "kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"
	const failed, partial = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
	o.want(t, "after the first sync", total, 40, "table", "nat", "ip_family", metrics.IPv4)
	o.want(t, "after the first sync", last, 5, "table", "filter", "ip_family", metrics.IPv4)
	o.want(t, "after the first sync", total, 9, "table", "nat", "ip_family", metrics.IPv6)
	o.want(t, "after the first sync", failed, 0, "ip_family", metrics.IPv4)

	be.failNextSync(errors.New("kernel says no"))
	p.Handler().OnService(c.db, nil)
	if err := p.Sync(t.Context(), false); err == nil {
		t.Fatal("the sync did not fail")
	}
	o.want(t, "after a failed sync", failed, 2, "ip_family", metrics.IPv4)
	o.want(t, "after a failed sync", partial, 1, "ip_family", metrics.IPv4)
	o.want(t, "after a failed sync", failed, 0, "ip_family", metrics.IPv6)
	o.want(t, "after a failed sync", total, 40, "table", "nat", "ip_family", metrics.IPv4)

	if err := p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	o.want(t, "after the retry", failed, 3, "ip_family", metrics.IPv4)
	o.want(t, "after the retry", total, 44, "table", "nat", "ip_family", metrics.IPv4)
	o.want(t, "after the retry", total, 9, "table", "nat", "ip_family", metrics.IPv6)
}

// TestReconcilerMetrics records each reconciliation: the entries deleted
// in each family, and the pass's duration in both.
func TestReconcilerMetrics(t *testing.T) {
	ct := &recordingConntrack{deleted: conntrack.Deleted{IPv4: 3, IPv6: 1}}
	m := metrics.New("nftables")
	o := &observed{m: m}
	p := proxy.New(proxy.Options{NodeName: "n1", Backend: newFakeBackend(), Conntrack: ct, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	h := p.Handler()
	h.OnService(nil, service("dns", "10.96.0.53", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}))
	udp := corev1.ProtocolUDP
	h.OnEndpointSlice(nil, endpointSlice("dns-1", "dns", ports(discoveryv1.EndpointPort{Name: new("dns"), Port: new(int32(53)), Protocol: &udp}),
		"10.244.0.53"))
	h.OnSynced()
	for range 2 {
		if err := p.Sync(t.Context(), true); err != nil {
			t.Fatal(err)
		}
	}
	const deleted, took = "kubeproxy_conntrack_reconciler_deleted_entries_total", "kubeproxy_conntrack_reconciler_sync_duration_seconds"
	o.want(t, "after two full syncs", deleted, 6, "ip_family", metrics.IPv4)
	o.want(t, "after two full syncs", deleted, 2, "ip_family", metrics.IPv6)
	o.want(t, "after two full syncs", took, 2, "ip_family", metrics.IPv4)
	o.want(t, "after two full syncs", took, 2, "ip_family", metrics.IPv6)
}

// TestNetworkProgrammingPerFamily observes each slice change in the series
// of its address type; deleting a slice drops the pending times of its
// family only, as kube-proxy's per-family trackers do.
func TestNetworkProgrammingPerFamily(t *testing.T) {
	o := newObserved(t)
	c := newCluster()
	c.web.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
	c.feed(o.p)
	if err := o.p.Sync(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	at := o.clock.now().Add(time.Second)
	stamp := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		return s
	}
	v6 := stamp(endpointSlice("web-v6", "web", c.webEPs.Ports, "fd00:244::11"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	gone6 := stamp(endpointSlice("web-v6-old", "web", c.webEPs.Ports, "fd00:244::12"))
	gone6.AddressType = discoveryv1.AddressTypeIPv6
	o.clock.advance(3 * time.Second)
	h := o.p.Handler()
	h.OnEndpointSlice(nil, gone6)
	h.OnEndpointSlice(c.webEPs, stamp(withAddrs(c.webEPs, "10.244.0.11")))
	h.OnEndpointSlice(gone6, nil) // drops gone6's time, not the IPv4 slice's
	h.OnEndpointSlice(nil, v6)
	if err := o.p.Sync(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	const name = "kubeproxy_network_programming_duration_seconds"
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		if n, sum := o.metric(t, name, "ip_family", f); n != 1 || sum != 2 {
			t.Errorf("%s: %v observations summing to %vs, want one of 2s", f, n, sum)
		}
	}
}
