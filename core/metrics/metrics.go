// Package metrics holds Weir's Prometheus metrics and serves them on
// metricsBindAddress.
//
// The sync, change and network-programming metrics carry kube-proxy's names
// (kubeproxy_*), types and buckets, so dashboards and alerts written for
// kube-proxy keep working; the hook plugin and backend metrics are Weir's
// own (weir_*). Weir programs both IP families in one sync, so the metrics
// kube-proxy splits by ip_family have a single series here, without that
// label.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is one registry of Weir's metrics with the methods that update
// them. Every method is safe for concurrent use.
type Metrics struct {
	reg  *prometheus.Registry
	mode string

	syncDuration, syncFull, syncPartial prometheus.Histogram
	lastSync, lastQueued                prometheus.Gauge
	networkProgramming                  prometheus.Histogram
	endpointChanges, serviceChanges     prometheus.Counter
	endpointPending, servicePending     prometheus.Gauge
	healthz, livez                      *prometheus.CounterVec // by code
	commitFailures                      *prometheus.CounterVec // by mode

	pluginCalls, pluginFailures *prometheus.CounterVec   // by plugin
	pluginDuration              *prometheus.HistogramVec // by plugin
	pluginQuarantined           *prometheus.GaugeVec     // by plugin
}

// syncBuckets is kube-proxy's layout for sync durations: 1 ms to about 16 s,
// doubling.
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
	m.newWeirMetrics()
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) newSyncMetrics() {
	hist := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Subsystem: "kubeproxy", Name: name, Help: help, Buckets: syncBuckets})
		m.reg.MustRegister(h)
		return h
	}
	m.syncDuration = hist("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds")
	m.syncFull = hist("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs")
	m.syncPartial = hist("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs")
	m.lastSync = m.gauge("kubeproxy", "sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced")
	m.lastQueued = m.gauge("kubeproxy", "sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued")
	m.networkProgramming = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "network_programming_duration_seconds",
		Help:    "In Cluster Network Programming Latency in seconds",
		Buckets: networkProgrammingBuckets(),
	})
	m.reg.MustRegister(m.networkProgramming)
}

func (m *Metrics) newChangeMetrics() {
	m.endpointChanges = m.counter("kubeproxy", "sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes")
	m.endpointPending = m.gauge("kubeproxy", "sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes")
	m.serviceChanges = m.counter("kubeproxy", "sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes")
	m.servicePending = m.gauge("kubeproxy", "sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes")
	probes := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: name, Help: help}, []string{"code"})
		m.reg.MustRegister(c)
		return c
	}
	m.healthz = probes("proxy_healthz_total", "Cumulative proxy healthz HTTP status")
	m.livez = probes("proxy_livez_total", "Cumulative proxy livez HTTP status")
}

func (m *Metrics) newWeirMetrics() {
	m.commitFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "weir", Name: "backend_commit_failures_total",
		Help: "Cumulative failed commits of a plan by the backend; the kernel keeps the previous rules",
	}, []string{"mode"})
	m.commitFailures.WithLabelValues(m.mode) // present from the start, at 0
	plugin := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weir", Name: name, Help: help}, []string{"plugin"})
		m.reg.MustRegister(c)
		return c
	}
	m.pluginCalls = plugin("plugin_calls_total", "Cumulative calls of a hook plugin")
	m.pluginFailures = plugin("plugin_failures_total", "Cumulative failed calls of a hook plugin (trap, timeout, bad output)")
	m.pluginDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "weir", Name: "plugin_call_duration_seconds", Help: "Duration of one call of a hook plugin",
		Buckets: pluginBuckets,
	}, []string{"plugin"})
	m.pluginQuarantined = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "weir", Name: "plugin_quarantined",
		Help: "1 while a hook plugin is quarantined after repeated failures, else 0",
	}, []string{"plugin"})
	m.reg.MustRegister(m.commitFailures, m.pluginDuration, m.pluginQuarantined)
}

func (m *Metrics) counter(subsystem, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help})
	m.reg.MustRegister(c)
	return c
}

func (m *Metrics) gauge(subsystem, name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: name, Help: help})
	m.reg.MustRegister(g)
	return g
}

// Registry returns the registry that holds every metric.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Synced records a successful sync that started took ago and ended at end.
func (m *Metrics) Synced(full bool, took time.Duration, end time.Time) {
	s := took.Seconds()
	m.syncDuration.Observe(s)
	if full {
		m.syncFull.Observe(s)
	} else {
		m.syncPartial.Observe(s)
	}
	m.lastSync.Set(seconds(end))
}

// CommitFailed counts a plan the backend failed to commit.
func (m *Metrics) CommitFailed() { m.commitFailures.WithLabelValues(m.mode).Inc() }

// Queued records that a sync was asked for at t.
func (m *Metrics) Queued(t time.Time) { m.lastQueued.Set(seconds(t)) }

// ServiceChanged counts one Service change.
func (m *Metrics) ServiceChanged() { m.serviceChanges.Inc() }

// EndpointsChanged counts one EndpointSlice change.
func (m *Metrics) EndpointsChanged() { m.endpointChanges.Inc() }

// Pending sets how many services have Service and EndpointSlice changes
// not yet synced.
func (m *Metrics) Pending(services, endpoints int) {
	m.servicePending.Set(float64(services))
	m.endpointPending.Set(float64(endpoints))
}

// NetworkProgrammed records the time from an EndpointSlice change in the
// cluster to the commit of the rules it needed.
func (m *Metrics) NetworkProgrammed(d time.Duration) { m.networkProgramming.Observe(d.Seconds()) }

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
