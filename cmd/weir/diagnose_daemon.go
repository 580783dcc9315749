package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/sdk/plan"
)

// daemonClient reads a running weir's debug endpoint.
type daemonClient struct {
	base   string
	client *http.Client
	status debugStatus
}

// findDaemon returns a client of the weir run serving metrics at addr on
// this node, or nil when none answers there.
func findDaemon(ctx context.Context, addr string) *daemonClient {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || addr == "" {
		return nil
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	d := &daemonClient{base: "http://" + net.JoinHostPort(host, port), client: &http.Client{Timeout: 2 * time.Second}}
	if err := d.get(ctx, debugStatusPath, &d.status); err != nil {
		return nil
	}
	return d
}

// service returns what the daemon holds of the Service namespace/name.
func (d *daemonClient) service(ctx context.Context, name string) (serviceDetail, error) {
	var v serviceDetail
	err := d.get(ctx, debugServicePath+"?name="+url.QueryEscape(name), &v)
	return v, err
}

// details returns what the daemon holds of the named Services: one
// request for each, or one for every Service when all is true.
func (d *daemonClient) details(ctx context.Context, names []string, all bool) ([]serviceDetail, error) {
	out := make([]serviceDetail, len(names))
	if !all {
		for i, name := range names {
			v, err := d.service(ctx, name)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	var every []serviceDetail
	if err := d.get(ctx, debugServicesPath+"?detail=true", &every); err != nil {
		return nil, err
	}
	byName := make(map[string]serviceDetail, len(every))
	for _, v := range every {
		byName[v.Name] = v
	}
	for i, name := range names {
		out[i] = byName[name]
	}
	return out, nil
}

func (d *daemonClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base+path, nil)
	if err != nil {
		return err
	}
	res, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", path, res.Status, body)
	}
	return json.NewDecoder(res.Body).Decode(v)
}

// daemonFindings says how the daemon's syncs and plugins are doing.
func (d *daemonClient) findings(now time.Time) []diagnose.Finding {
	f := func(code string, sev diagnose.Severity, subject, format string, args ...any) diagnose.Finding {
		return diagnose.Finding{Code: code, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...)}
	}
	st := d.status.Sync
	var out []diagnose.Finding
	switch {
	case st.Last.IsZero():
		out = append(out, f("sync.none-yet", diagnose.Warning, "weir", "weir run has not synced yet (it waits for the source's objects)"))
	case st.Failures > 0:
		since := "it never succeeded"
		if !st.LastSuccess.IsZero() {
			since = fmt.Sprintf("the kernel keeps the rules of the last good sync, %s ago", now.Sub(st.LastSuccess).Round(time.Second))
		}
		out = append(out, f("sync.failing", diagnose.Broken, "weir",
			"the last %d %s failed, the latest %s ago: %s; %s", st.Failures, plural(st.Failures, "sync", "syncs"),
			now.Sub(st.Last).Round(time.Second), st.Error, since))
	default:
		kind := "partial"
		if st.Full {
			kind = "full"
		}
		out = append(out, f("sync.last", diagnose.Info, "weir", "the last sync (%s, %d service ports) ended %s ago and took %v",
			kind, st.Services, now.Sub(st.Last).Round(time.Second), st.Took.Round(time.Microsecond)))
	}
	for name, ps := range d.status.Plugins {
		switch {
		case ps.Quarantined:
			out = append(out, f("plugins.quarantined", diagnose.Warning, "plugin "+name,
				"quarantined after failing: its failure policy applies to every service it matches until it recovers (last error: %s)", ps.LastError))
		case ps.Failures > 0:
			out = append(out, f("plugins.failures", diagnose.Warning, "plugin "+name,
				"failed %d of %d calls, the latest %s ago: %s", ps.Failures, ps.Calls, now.Sub(ps.LastErrorAt).Round(time.Second), ps.LastError))
		}
	}
	return out
}

// planOf returns a plan holding the daemon's final services, with its
// node and service CIDRs: what the kernel should hold for them.
func (d *daemonClient) planOf(finals []*plan.Service) *plan.Plan {
	p := &plan.Plan{Node: d.status.PlanNode, ServiceCIDRs: d.status.ServiceCIDRs, Services: map[plan.Key]*plan.Service{}}
	for _, s := range finals {
		p.Services[s.Key] = s
	}
	return p
}
