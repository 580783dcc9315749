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

// Problems returns what the planner left out of the Service
// namespace/name as bad input in the latest sync, and the destinations
// its ports lost to other services claiming them, one sentence each.
func (p *Proxy) Problems(name string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.problemsOf(name)
}

// problemsOf is Problems with the lock held.
func (p *Proxy) problemsOf(name string) []string {
	var out []string
	for _, pr := range p.problems[name] {
		out = append(out, pr.String())
	}
	for _, k := range p.byService[name] {
		for _, pr := range p.conflicts[k] {
			out = append(out, k.String()+": "+pr.String())
		}
	}
	return out
}
