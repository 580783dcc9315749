package kubeproxy

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Snapshot is what kube-proxy's metrics say about its syncs at one moment.
// Weir serves the same metrics under the same names, so a Snapshot reads
// either.
type Snapshot struct {
	// ServiceChanges and SliceChanges count the Service and EndpointSlice
	// events the proxy received (each family's proxier counts a Service
	// event; only the slice's family counts a slice's).
	ServiceChanges, SliceChanges float64
	// ServicePending and SlicePending are the changes received and not yet
	// taken by a sync.
	ServicePending, SlicePending float64
	// Families holds each IP family's sync figures, by "IPv4" or "IPv6".
	Families map[string]Family
	// InFlight is the number of syncs that had started and not finished
	// (from the log) when the metrics were read.
	InFlight int
}

// Family is one IP family's proxier's sync figures.
type Family struct {
	// LastSync is when its last successful sync ended, LastQueued when a
	// sync was last asked for (Unix seconds; 0 when never).
	LastSync, LastQueued float64
	// Syncs counts the syncs that ended, successful or not.
	Syncs uint64
}

// Scrape reads kube-proxy's metrics.
func (p *Process) Scrape(ctx context.Context) (Snapshot, error) {
	inFlight := p.out.inFlight()
	s, err := ScrapeURL(ctx, p.http, "http://"+MetricsAddress+"/metrics")
	s.InFlight = inFlight
	return s, err
}

// ScrapeURL reads the sync metrics a proxy serves at url, through c;
// InFlight is left zero.
func ScrapeURL(ctx context.Context, c *http.Client, url string) (Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Snapshot{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return Snapshot{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Snapshot{}, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return parseSnapshot(resp.Body)
}

// parseSnapshot reads a Snapshot from the Prometheus text format.
func parseSnapshot(r io.Reader) (Snapshot, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Snapshot{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := Snapshot{Families: map[string]Family{}}
	value := func(name string) float64 {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			return 0
		}
		m := mf.GetMetric()[0]
		return m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	s.ServiceChanges = value("kubeproxy_sync_proxy_rules_service_changes_total")
	s.SliceChanges = value("kubeproxy_sync_proxy_rules_endpoint_changes_total")
	s.ServicePending = value("kubeproxy_sync_proxy_rules_service_changes_pending")
	s.SlicePending = value("kubeproxy_sync_proxy_rules_endpoint_changes_pending")
	perFamily := func(name string, set func(f *Family, m *dto.Metric)) {
		for _, m := range mfs[name].GetMetric() {
			fam := label(m, "ip_family")
			f := s.Families[fam]
			set(&f, m)
			s.Families[fam] = f
		}
	}
	perFamily("kubeproxy_sync_proxy_rules_last_timestamp_seconds", func(f *Family, m *dto.Metric) { f.LastSync = m.GetGauge().GetValue() })
	perFamily("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", func(f *Family, m *dto.Metric) { f.LastQueued = m.GetGauge().GetValue() })
	perFamily("kubeproxy_sync_proxy_rules_duration_seconds", func(f *Family, m *dto.Metric) { f.Syncs = m.GetHistogram().GetSampleCount() })
	return s, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Changes is what a caller wrote through the API and waits for a proxy to
// commit: how many Service and EndpointSlice events it caused (creations,
// updates that changed the object, deletions), and whether it changed this
// node's Node in a way the proxy acts upon (its zone label), which no
// counter counts.
type Changes struct {
	Services, Slices int
	Node             bool
}

// settled reports whether s shows every change since mark received and
// committed: the events counted, nothing pending, no sync running, and
// every family's last sync ended after it was last asked for one.
func (s Snapshot) settled(mark Snapshot, want Changes) bool {
	if s.ServiceChanges-mark.ServiceChanges < float64(want.Services) ||
		s.SliceChanges-mark.SliceChanges < float64(want.Slices) {
		return false
	}
	if s.ServicePending != 0 || s.SlicePending != 0 || s.InFlight != 0 || len(s.Families) == 0 {
		return false
	}
	for k, f := range s.Families {
		if f.LastQueued > f.LastSync || want.Node && f.LastQueued <= mark.Families[k].LastQueued {
			return false
		}
	}
	return true
}

// same reports whether two snapshots show the same syncs.
func (s Snapshot) same(o Snapshot) bool {
	if s.ServiceChanges != o.ServiceChanges || s.SliceChanges != o.SliceChanges || len(s.Families) != len(o.Families) {
		return false
	}
	for k, f := range s.Families {
		if o.Families[k] != f {
			return false
		}
	}
	return true
}

// settlePoll is how often WaitSettled reads the metrics; two readings this
// far apart must agree.
const settlePoll = 20 * time.Millisecond

// Proxy is a running proxy whose kube-proxy metrics can be read:
// kube-proxy's Process, or Weir's (test/weirrun).
type Proxy interface {
	// Scrape reads the proxy's sync metrics.
	Scrape(ctx context.Context) (Snapshot, error)
	// Done is closed once the process has exited; Err then says how.
	Done() <-chan struct{}
	Err() error
}

// WaitSettled waits until kube-proxy has received the changes made since
// mark was scraped and committed them (see WaitSettled).
func (p *Process) WaitSettled(ctx context.Context, mark Snapshot, want Changes) error {
	return WaitSettled(ctx, p, mark, want)
}

// WaitSettled waits until p has received the changes made since mark was
// scraped and committed them: see Snapshot.settled, true in two readings
// settlePoll apart that show the same syncs (a sync asked for between the
// two would show). It fails when ctx ends first or p exits.
func WaitSettled(ctx context.Context, p Proxy, mark Snapshot, want Changes) error {
	var prev Snapshot
	var last error
	for {
		s, err := p.Scrape(ctx)
		switch {
		case err != nil:
			last = err
		case s.settled(mark, want) && prev.settled(mark, want) && s.same(prev):
			return nil
		default:
			last = fmt.Errorf("not settled: %s", s)
		}
		prev = s
		select {
		case <-p.Done():
			return fmt.Errorf("the proxy exited: %w", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("the proxy did not commit %+v in time: %w", want, last)
		case <-time.After(settlePoll):
		}
	}
}

// WaitFirstSync waits until kube-proxy has committed its first sync of
// every family it runs and settled. It fails at once when kube-proxy did
// not take its configuration file strictly (a field it does not know,
// which it ignores): the caller's configuration is not what runs.
func (p *Process) WaitFirstSync(ctx context.Context) error {
	return WaitFirstSync(ctx, p)
}

// configError says whether kube-proxy ignored part of its configuration.
func (p *Process) configError() error {
	if log := p.Log(); strings.Contains(log, "strict decoding failed") {
		return fmt.Errorf("kube-proxy ignored part of its configuration:\n%s", firstLine(log, "strict decoding failed"))
	}
	return nil
}

// WaitFirstSync waits until p has committed its first sync of every family
// it runs and settled.
func WaitFirstSync(ctx context.Context, p Proxy) error {
	for {
		if c, ok := p.(interface{ configError() error }); ok {
			if err := c.configError(); err != nil {
				return err
			}
		}
		s, err := p.Scrape(ctx)
		if err == nil && len(s.Families) > 0 && allSynced(s) {
			return WaitSettled(ctx, p, s, Changes{})
		}
		select {
		case <-p.Done():
			return fmt.Errorf("the proxy exited before its first sync: %w", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("the proxy made no first sync in time (last reading %v): %w", s, cmp.Or(err, ctx.Err()))
		case <-time.After(settlePoll):
		}
	}
}

// allSynced reports whether every family has a successful sync.
func allSynced(s Snapshot) bool {
	for _, f := range s.Families {
		if f.LastSync == 0 {
			return false
		}
	}
	return true
}

// String describes the snapshot for error messages.
func (s Snapshot) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "services %g (pending %g), slices %g (pending %g), in flight %d",
		s.ServiceChanges, s.ServicePending, s.SliceChanges, s.SlicePending, s.InFlight)
	for k, f := range s.Families {
		fmt.Fprintf(&b, "; %s: %d syncs, last %.3f, queued %.3f", k, f.Syncs, f.LastSync, f.LastQueued)
	}
	return b.String()
}

// firstLine returns the first line of text that holds s.
func firstLine(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
