package proxy

import "github.com/weirproxy/weir/backends"

// reportBackend hands the metrics the figures of the backend's latest
// Sync, when the backend keeps them (backends.Reporter): every write the
// kernel refused, and, after a Sync that succeeded, the rule counts.
func (p *Proxy) reportBackend() {
	r, ok := p.opts.Backend.(backends.Reporter)
	m := p.opts.Metrics
	if !ok || m == nil {
		return
	}
	for _, f := range r.Report().Families {
		m.BackendFailed(f.Family, f.Failed, f.FailedPartial)
		for table, n := range f.Tables {
			m.BackendRules(f.Family, table, n.Total, n.Written)
		}
	}
}
