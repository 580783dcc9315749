package main

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
)

// diagnoseState is the plan weir diagnose computed from the source, by
// Service (namespace/name).
type diagnoseState struct {
	p               *proxy.Proxy
	planned, finals map[string]map[plan.Key]*plan.Service
	changes         map[string][]diagnose.PluginChange
	final           *plan.Plan
	pluginErr       error
}

// diagnosePlan loads the source and the plugins as weir plan does and
// plans every service once, remembering what each plugin changed.
func diagnosePlan(ctx, load context.Context, env *environment) (*diagnoseState, error) {
	st := &diagnoseState{changes: map[string][]diagnose.PluginChange{}}
	chain, err := newChain(load, env, hooks.Options{OnChange: func(plugin string, before, after *plan.Service) {
		if before == nil {
			return
		}
		name := before.Key.Namespace + "/" + before.Key.Name
		st.changes[name] = append(st.changes[name], diagnose.PluginChange{Plugin: plugin, Before: before, After: after})
	}})
	if err != nil {
		return nil, err
	}
	defer closeChain(chain)
	st.p, err = loadedProxy(load, env, nil, chain)
	if err != nil {
		return nil, err
	}
	if err := st.p.Sync(ctx, true); err != nil {
		return nil, err
	}
	st.pluginErr = st.p.PluginFailures()
	st.final = st.p.Plan()
	st.planned, st.finals = byServiceName(st.p.Planned()), byServiceName(st.final)
	return st, nil
}

// problems returns the planner's reports of a Service's bad input.
func (st *diagnoseState) problems(name string) []string { return st.p.Problems(name) }

// byServiceName groups a plan's services by namespace/name.
func byServiceName(p *plan.Plan) map[string]map[plan.Key]*plan.Service {
	out := map[string]map[plan.Key]*plan.Service{}
	for k, s := range p.Services {
		name := k.Namespace + "/" + k.Name
		if out[name] == nil {
			out[name] = map[plan.Key]*plan.Service{}
		}
		out[name][k] = s
	}
	return out
}

// kernelState is what reading the kernel back found against the plan.
type kernelState struct {
	byKey     map[plan.Key][]string
	anomalies []string
}

// kernelDifferences reads the configured mode's rules back and compares
// them with the final plan, by service port. Destinations the kernel
// serves for no planned service are left out: no service owns them.
func kernelDifferences(ctx context.Context, env *environment, final *plan.Plan) (*kernelState, error) {
	reader, closeReader, err := newReader(env)
	if err != nil {
		return nil, err
	}
	defer closeReader()
	want, owners := reader.Expected(final)
	got, err := reader.ReadBack(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the %s rules back: %w", env.cfg.Mode, err)
	}
	ks := &kernelState{byKey: map[plan.Key][]string{}}
	for _, d := range backends.Compare(want, owners, got) {
		switch {
		case d.Field == "anomaly":
			ks.anomalies = append(ks.anomalies, "the kernel's rules are inconsistent: "+d.Got)
		case d.Service != (plan.Key{}):
			ks.byKey[d.Service] = append(ks.byKey[d.Service],
				fmt.Sprintf("%s: %s: want %s, got %s", d.Destination, d.Field, d.Want, d.Got))
		}
	}
	return ks, nil
}

// nodeCheckOptions tells the node checks what the configuration sets up.
func nodeCheckOptions(env *environment) diagnose.NodeOptions {
	c := env.cfg
	dual := slices.ContainsFunc(append(slices.Clone(c.ClusterCIDRs), c.ServiceCIDRs...), func(p netip.Prefix) bool { return p.Addr().Is6() })
	return diagnose.NodeOptions{
		Mode: c.Mode, IptablesFlavour: c.IPTables.Backend, NFTablesTable: c.NFTables.Table, IPVSInterface: c.IPVS.Interface,
		LocalhostNodePorts: c.LocalhostNodePorts && !c.NodePortAddresses.Primary && len(c.NodePortAddresses.CIDRs) == 0,
		HealthzAddress:     c.HealthzBindAddress, MetricsAddress: c.MetricsBindAddress, DualStack: dual,
	}
}

// readFlows counts the conntrack table's entries to the destinations of
// services' ports, in one read of the table; when it cannot, it says why
// in a warning and returns nil.
func readFlows(ctx context.Context, env *environment, services map[plan.Key]*plan.Service, rep *diagnose.Report) map[plan.Key][]conntrack.FlowCount {
	ct, err := conntrack.New(0, env.log)
	if err == nil {
		defer ct.Close()
	}
	var serving []conntrack.Serving
	var owners []plan.Key
	for _, k := range slices.SortedFunc(maps.Keys(services), plan.Key.Compare) {
		for _, s := range conntrack.DestinationsOf(services[k]) {
			serving = append(serving, s)
			owners = append(owners, k)
		}
	}
	if len(serving) == 0 {
		return map[plan.Key][]conntrack.FlowCount{}
	}
	var counts []conntrack.FlowCount
	if err == nil {
		counts, err = ct.Count(ctx, serving)
	}
	if err != nil {
		rep.Add(diagnose.Finding{Code: "conntrack.unread", Severity: diagnose.Warning, Subject: "conntrack",
			Message: "cannot read the conntrack table, so the flows are not counted: " + err.Error()})
		return nil
	}
	out := map[plan.Key][]conntrack.FlowCount{}
	for k := range services {
		out[k] = []conntrack.FlowCount{}
	}
	for i, c := range counts {
		out[owners[i]] = append(out[owners[i]], c)
	}
	return out
}
