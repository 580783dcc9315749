package metrics

// newModeMetrics registers what only the mode's backend reports, as
// kube-proxy registers it per mode: in mode iptables the rule counts per
// table and the failed restores, in mode nftables the failed transactions
// and failed cleanups. Mode ipvs has none: Weir's IPVS backend reports no
// figures.
func (m *Metrics) newModeMetrics() {
	switch m.mode {
	case "iptables":
		m.backendFailures = m.counterVec("kubeproxy", "sync_proxy_rules_iptables_restore_failures_total",
			"Cumulative iptables-restore runs that failed", "ip_family")
		m.partialFailures = m.counterVec("kubeproxy", "sync_proxy_rules_iptables_partial_restore_failures_total",
			"Cumulative iptables-restore runs of a partial sync that failed, after which every chain was rewritten", "ip_family")
		m.rulesTotal = m.gaugeVec("kubeproxy", "sync_proxy_rules_iptables_total",
			"Number of iptables rules the proxy owns, per table", "table", "ip_family")
		m.rulesLast = m.gaugeVec("kubeproxy", "sync_proxy_rules_iptables_last",
			"Number of iptables rules the last sync wrote, per table", "table", "ip_family")
	case "nftables":
		m.backendFailures = m.counterVec("kubeproxy", "sync_proxy_rules_nftables_sync_failures_total",
			"Cumulative nftables transactions of a sync that the kernel refused", "ip_family")
		// Weir deletes stale objects in the sync's own transaction: there is
		// no separate cleanup to fail, and the counter stays at 0.
		cleanup := m.counterVec("kubeproxy", "sync_proxy_rules_nftables_cleanup_failures_total",
			"Cumulative failed nftables cleanups of stale objects (always 0: Weir deletes them in the sync's transaction)", "ip_family")
		for _, f := range families {
			cleanup.WithLabelValues(f)
		}
	}
}

// BackendFailed counts the writes of one sync that the kernel refused in
// family, and how many of them carried only the changed services: failed
// iptables-restore runs and partial restores in mode iptables, failed
// transactions in mode nftables (partial ones are not told apart there).
func (m *Metrics) BackendFailed(family string, failed, partial int) {
	if m.backendFailures != nil {
		m.backendFailures.WithLabelValues(family).Add(float64(failed))
	}
	if m.partialFailures != nil {
		m.partialFailures.WithLabelValues(family).Add(float64(partial))
	}
}

// BackendRules sets, after a successful sync, how many rules the backend
// owns in table of family and how many of them that sync wrote (mode
// iptables; ignored elsewhere).
func (m *Metrics) BackendRules(family, table string, total, written int) {
	if m.rulesTotal == nil {
		return
	}
	m.rulesTotal.WithLabelValues(table, family).Set(float64(total))
	m.rulesLast.WithLabelValues(table, family).Set(float64(written))
}
