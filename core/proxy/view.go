package proxy

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// ServiceView is what the proxy holds of one Service, for weir diagnose
// and the daemon's debug endpoint.
type ServiceView struct {
	// Planned and Final are the Service's ports in the plan before and
	// after the hook plugins.
	Planned []*plan.Service `json:"planned"`
	Final   []*plan.Service `json:"final"`
	// Problems are the planner's reports of its bad input (Problems).
	Problems []string `json:"problems,omitempty"`
	// Committed is when each port's rules last changed in the kernel, by
	// the port's key (plan.Key.String()).
	Committed map[string]time.Time `json:"committed,omitempty"`
}

// SyncStatus says how the proxy's syncs went.
type SyncStatus struct {
	// Last is when the latest sync ended, Full whether it was a full one,
	// Took how long it took and Error why it failed ("" when it did not).
	Last  time.Time     `json:"last"`
	Full  bool          `json:"full"`
	Took  time.Duration `json:"took"`
	Error string        `json:"error,omitempty"`
	// Failures counts the failed syncs since the last success.
	Failures int `json:"failures"`
	// LastSuccess is when a sync last succeeded.
	LastSuccess time.Time `json:"lastSuccess"`
	// Services counts the service ports in the final plan.
	Services int `json:"services"`
}

// Service returns what the proxy holds of the Service namespace/name.
func (p *Proxy) Service(name string) ServiceView {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := ServiceView{Committed: map[string]time.Time{}}
	for _, k := range p.byService[name] {
		if s := p.plan.Services[k]; s != nil {
			v.Planned = append(v.Planned, s.Clone())
		}
		if s := p.final.Services[k]; s != nil {
			v.Final = append(v.Final, s.Clone())
		}
		if at, ok := p.committedAt[k]; ok {
			v.Committed[k.String()] = at
		}
	}
	v.Problems = p.problemsOf(name)
	return v
}

// ServiceNames returns the namespace/name of every Service in the plan,
// sorted.
func (p *Proxy) ServiceNames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.byService))
}

// SyncStatus returns how the proxy's syncs went.
func (p *Proxy) SyncStatus() SyncStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.status
	s.Services = len(p.final.Services)
	return s
}

// noteSync records a sync's outcome in the status, and after a success
// when each changed key's rules were committed (removed keys are
// forgotten): the work follows the changes.
func (p *Proxy) noteSync(full bool, start, end time.Time, changed []plan.Key, err error) {
	p.status.Last, p.status.Full, p.status.Took = end, full, end.Sub(start)
	if err != nil {
		p.status.Error = err.Error()
		p.status.Failures++
		return
	}
	p.status.Error, p.status.Failures, p.status.LastSuccess = "", 0, end
	for _, k := range changed {
		if _, ok := p.final.Services[k]; ok {
			p.committedAt[k] = end
		} else {
			delete(p.committedAt, k)
		}
	}
}

// Context returns the node and the service CIDRs of the current plan:
// what a backend's view of a service's rules depends on besides the
// service (backends.Reader's Expected).
func (p *Proxy) Context() (plan.Node, []netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.final.Node.Clone(), slices.Clone(p.final.ServiceCIDRs)
}
