// Package metrics holds Weir's Prometheus metrics and serves them on
// metricsBindAddress.
//
// The kubeproxy_* metrics carry kube-proxy's names, types, labels and
// buckets, so dashboards and alerts written for kube-proxy keep working;
// the hook plugin and backend metrics are Weir's own (weir_*). Like
// kube-proxy, some are registered only in the mode they describe: the
// iptables rule counts and restore failures in mode iptables, the nftables
// failures in mode nftables.
//
// kube-proxy runs one proxier per IP family, both on any node whose kernel
// has the two (whatever the cluster's own families), and labels most of
// its metrics with ip_family. Weir syncs both families in one pass. Where
// it knows a figure per family, it reports that figure under each label:
// services without local endpoints, iptables rule counts and failed
// restores, failed nftables transactions (one carries the tables it
// changes), the conntrack entries the reconciler deleted, and the network
// programming latency of each EndpointSlice, by its address type. Where a
// figure belongs to the whole pass (its duration, its timestamps, the
// reconciler's duration), the same observation goes under both labels, as
// a dual-stack kube-proxy records one per proxier. Queries that filter on
// ip_family therefore find their series; those that ignore it see two
// identical series, and sums over ip_family count twice, as they do on a
// dual-stack kube-proxy.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The IP families, as kube-proxy's ip_family label spells them.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// families are the IP families Weir serves: every backend programs both
// in each sync.
var families = []string{IPv4, IPv6}

// Metrics is one registry of Weir's metrics with the methods that update
// them. Every method is safe for concurrent use.
type Metrics struct {
	reg  *prometheus.Registry
	mode string

	syncDuration, syncFull, syncPartial *prometheus.HistogramVec // by ip_family
	lastSync, lastQueued                *prometheus.GaugeVec     // by ip_family
	networkProgramming                  *prometheus.HistogramVec // by ip_family
	endpointChanges, serviceChanges     prometheus.Counter
	endpointPending, servicePending     prometheus.Gauge
	healthz, livez                      *prometheus.CounterVec // by code
	noLocalEndpoints                    *prometheus.GaugeVec   // by traffic_policy, ip_family
	reconcileDuration                   *prometheus.HistogramVec
	reconcileDeleted                    *prometheus.CounterVec // by ip_family
	// The backend's figures (modes.go), nil in the modes without them.
	backendFailures, partialFailures *prometheus.CounterVec // by ip_family
	rulesTotal, rulesLast            *prometheus.GaugeVec   // by table, ip_family
	commitFailures                   *prometheus.CounterVec // by mode

	pluginCalls, pluginFailures *prometheus.CounterVec   // by plugin
	pluginDuration              *prometheus.HistogramVec // by plugin
	pluginQuarantined           *prometheus.GaugeVec     // by plugin
	pluginPullFailures          *prometheus.CounterVec   // by plugin
	signalsDuration             prometheus.Histogram
	signalsFailures             prometheus.Counter
	signalsMoved                prometheus.Counter
}

// syncBuckets is kube-proxy's layout for sync durations, also its
// conntrack reconciler's: 1 ms to about 16 s, doubling.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// networkProgrammingBuckets is kube-proxy's layout for network programming
// latency: 0.25 s and 0.5 s, every second to 59 s, every 5 s to 115 s, then
// every 30 s to 5 minutes.
func networkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// pluginBuckets spans a plugin call: 100 µs to about 3.3 s, doubling.
var pluginBuckets = prometheus.ExponentialBuckets(0.0001, 2, 16)

// New returns the metrics of a proxy in mode (nftables, iptables or ipvs),
// registered with a new registry that also holds the Go runtime and process
// collectors.
func New(mode string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), mode: mode}
	m.newSyncMetrics()
	m.newChangeMetrics()
	m.newConntrackMetrics()
	m.newModeMetrics()
	m.newWeirMetrics()
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.startFamilies()
	return m
}

// startFamilies gives the counters, histograms and timestamps of both
// families a series from the start, at zero (a timestamp of 0: never), so
// that rate() and increase() see the first event. The gauges of state (the
// services without local endpoints, the rule counts) appear with the first
// successful sync, as in kube-proxy.
func (m *Metrics) startFamilies() {
	for _, f := range families {
		for _, h := range []*prometheus.HistogramVec{m.syncDuration, m.syncFull, m.syncPartial, m.networkProgramming, m.reconcileDuration} {
			h.WithLabelValues(f)
		}
		for _, g := range []*prometheus.GaugeVec{m.lastSync, m.lastQueued} {
			g.WithLabelValues(f)
		}
		for _, c := range []*prometheus.CounterVec{m.reconcileDeleted, m.backendFailures, m.partialFailures} {
			if c != nil {
				c.WithLabelValues(f)
			}
		}
	}
}

func (m *Metrics) newSyncMetrics() {
	hist := func(name, help string) *prometheus.HistogramVec {
		return m.histogram(prometheus.HistogramOpts{Subsystem: "kubeproxy", Name: name, Help: help, Buckets: syncBuckets}, "ip_family")
	}
	m.syncDuration = hist("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds")
	m.syncFull = hist("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs")
	m.syncPartial = hist("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs")
	m.lastSync = m.gaugeVec("kubeproxy", "sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", "ip_family")
	m.lastQueued = m.gaugeVec("kubeproxy", "sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", "ip_family")
	m.networkProgramming = m.histogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "network_programming_duration_seconds",
		Help:    "In Cluster Network Programming Latency in seconds",
		Buckets: networkProgrammingBuckets(),
	}, "ip_family")
	m.noLocalEndpoints = m.gaugeVec("kubeproxy", "sync_proxy_rules_no_local_endpoints_total",
		"Services with a Local traffic policy whose endpoints are all on other nodes", "traffic_policy", "ip_family")
}

func (m *Metrics) newChangeMetrics() {
	m.endpointChanges = m.counter("kubeproxy", "sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes")
	m.endpointPending = m.gauge("kubeproxy", "sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes")
	m.serviceChanges = m.counter("kubeproxy", "sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes")
	m.servicePending = m.gauge("kubeproxy", "sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes")
	m.healthz = m.counterVec("kubeproxy", "proxy_healthz_total", "Cumulative proxy healthz HTTP status", "code")
	m.livez = m.counterVec("kubeproxy", "proxy_livez_total", "Cumulative proxy livez HTTP status", "code")
}

func (m *Metrics) newConntrackMetrics() {
	m.reconcileDuration = m.histogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "conntrack_reconciler_sync_duration_seconds",
		Help: "Duration of one pass of the conntrack reconciler in seconds", Buckets: syncBuckets,
	}, "ip_family")
	m.reconcileDeleted = m.counterVec("kubeproxy", "conntrack_reconciler_deleted_entries_total",
		"Cumulative conntrack entries the reconciler deleted", "ip_family")
}

func (m *Metrics) newWeirMetrics() {
	m.commitFailures = m.counterVec("weir", "backend_commit_failures_total",
		"Cumulative failed commits of a plan by the backend; the kernel keeps the previous rules", "mode")
	m.commitFailures.WithLabelValues(m.mode) // present from the start, at 0
	m.pluginCalls = m.counterVec("weir", "plugin_calls_total", "Cumulative calls of a hook plugin", "plugin")
	m.pluginFailures = m.counterVec("weir", "plugin_failures_total", "Cumulative failed calls of a hook plugin (trap, timeout, bad output)", "plugin")
	m.pluginDuration = m.histogram(prometheus.HistogramOpts{
		Subsystem: "weir", Name: "plugin_call_duration_seconds", Help: "Duration of one call of a hook plugin",
		Buckets: pluginBuckets,
	}, "plugin")
	m.pluginQuarantined = m.gaugeVec("weir", "plugin_quarantined", "1 while a hook plugin is quarantined after repeated failures, else 0", "plugin")
	m.pluginPullFailures = m.counterVec("weir", "plugin_pull_failures_total",
		"Cumulative failed resolves or pulls of an oci:// hook plugin; the loaded version keeps serving", "plugin")
	m.signalsDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "weir", Name: "signals_read_duration_seconds",
		Help: "Duration of one reading of the live signals of the hook plugins that want them", Buckets: pluginBuckets,
	})
	m.reg.MustRegister(m.signalsDuration)
	m.signalsFailures = m.counter("weir", "signals_read_failures_total",
		"Cumulative failed readings of the plugins' live signals; the weights stay as they are")
	m.signalsMoved = m.counter("weir", "signals_moved_services_total",
		"Cumulative services whose live signals moved, sent to their plugins again")
}

// The registration helpers put every metric in a subsystem: kubeproxy for
// kube-proxy's names, weir for Weir's own.

func (m *Metrics) counter(subsystem, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help})
	m.reg.MustRegister(c)
	return c
}

func (m *Metrics) counterVec(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help}, labels)
	m.reg.MustRegister(c)
	return c
}

func (m *Metrics) gauge(subsystem, name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: name, Help: help})
	m.reg.MustRegister(g)
	return g
}

func (m *Metrics) gaugeVec(subsystem, name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: name, Help: help}, labels)
	m.reg.MustRegister(g)
	return g
}

func (m *Metrics) histogram(opts prometheus.HistogramOpts, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(opts, labels)
	m.reg.MustRegister(h)
	return h
}

// Registry returns the registry that holds every metric.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Synced records a successful sync that took took and ended at end, in
// every family's series: one sync programs both.
func (m *Metrics) Synced(full bool, took time.Duration, end time.Time) {
	s := took.Seconds()
	kind := m.syncPartial
	if full {
		kind = m.syncFull
	}
	for _, f := range families {
		m.syncDuration.WithLabelValues(f).Observe(s)
		kind.WithLabelValues(f).Observe(s)
		m.lastSync.WithLabelValues(f).Set(seconds(end))
	}
}

// CommitFailed counts a plan the backend failed to commit.
func (m *Metrics) CommitFailed() { m.commitFailures.WithLabelValues(m.mode).Inc() }

// Queued records that a sync of both families was asked for at t.
func (m *Metrics) Queued(t time.Time) {
	for _, f := range families {
		m.lastQueued.WithLabelValues(f).Set(seconds(t))
	}
}

// ServiceChanged counts one Service change.
func (m *Metrics) ServiceChanged() { m.serviceChanges.Inc() }

// EndpointsChanged counts one EndpointSlice change.
func (m *Metrics) EndpointsChanged() { m.endpointChanges.Inc() }

// Pending sets how many Service and EndpointSlice changes wait for a sync:
// services, the services with Service changes; slices, the EndpointSlice
// changes, as kube-proxy counts each.
func (m *Metrics) Pending(services, slices int) {
	m.servicePending.Set(float64(services))
	m.endpointPending.Set(float64(slices))
}

// NetworkProgrammed records the time from a change of an EndpointSlice of
// family (its address type) in the cluster to the commit of the rules it
// needed.
func (m *Metrics) NetworkProgrammed(family string, d time.Duration) {
	m.networkProgramming.WithLabelValues(family).Observe(d.Seconds())
}

// NoLocalEndpoints sets how many services of family have a Local traffic
// policy (policy "internal" or "external") and endpoints, none of which
// serves that traffic on this node.
func (m *Metrics) NoLocalEndpoints(family, policy string, services int) {
	m.noLocalEndpoints.WithLabelValues(policy, family).Set(float64(services))
}

// Reconciled records one pass of the conntrack reconciler over family:
// how long it took and how many entries it deleted there.
func (m *Metrics) Reconciled(family string, took time.Duration, deleted int) {
	m.reconcileDuration.WithLabelValues(family).Observe(took.Seconds())
	m.reconcileDeleted.WithLabelValues(family).Add(float64(deleted))
}

// Probe counts one answer of the health server to path (/healthz or
// /livez; others are ignored).
func (m *Metrics) Probe(path string, code int) {
	switch path {
	case "/healthz":
		m.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
	case "/livez":
		m.livez.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// PluginCalled records one call of a hook plugin: how long it took and
// whether it failed.
func (m *Metrics) PluginCalled(plugin string, took time.Duration, err error) {
	m.pluginCalls.WithLabelValues(plugin).Inc()
	m.pluginDuration.WithLabelValues(plugin).Observe(took.Seconds())
	if err != nil {
		m.pluginFailures.WithLabelValues(plugin).Inc()
	} else {
		m.pluginFailures.WithLabelValues(plugin) // show 0 for a plugin that never failed
	}
}

// PluginPullFailed counts one failed resolve or pull of an oci:// plugin
// (hooks.RegistryObserver).
func (m *Metrics) PluginPullFailed(plugin string, _ error) {
	m.pluginPullFailures.WithLabelValues(plugin).Inc()
}

// SignalsRead records one reading of the plugins' live signals: how long
// it took and whether it failed.
func (m *Metrics) SignalsRead(took time.Duration, err error) {
	m.signalsDuration.Observe(took.Seconds())
	if err != nil {
		m.signalsFailures.Inc()
	}
}

// SignalsMoved counts the services whose live signals moved, which the
// next sync sends to their plugins again.
func (m *Metrics) SignalsMoved(services int) {
	m.signalsMoved.Add(float64(services))
}

// PluginQuarantined records that a plugin entered or left quarantine.
func (m *Metrics) PluginQuarantined(plugin string, quarantined bool) {
	v := 0.0
	if quarantined {
		v = 1
	}
	m.pluginQuarantined.WithLabelValues(plugin).Set(v)
}

// seconds is t as a Unix timestamp in seconds.
func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Handler serves the metrics server's paths, as kube-proxy's does:
// /metrics in the Prometheus text format, /proxyMode with the mode as
// plain text, and /healthz answering "ok" while the process serves HTTP.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(m.mode))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
