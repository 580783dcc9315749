package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/core/source/files"
	"github.com/weirproxy/weir/core/source/kubernetes"
	"github.com/weirproxy/weir/sdk/plan"
)

// errFindings is what weir diagnose fails with when a finding says traffic
// is lost or the kernel differs from the plan.
var errFindings = errors.New("traffic is lost or the kernel differs from the plan")

func diagnoseFlags(fs *pflag.FlagSet) {
	loadFlags(fs)
	fs.StringP("output", "o", "text", "output format: text or json")
	fs.Bool("all", false, "every service, listing only those with warnings or worse")
	fs.String("from", "", "trace: the client's address")
	fs.String("to", "", "trace: the address and port connected to, ADDR:PORT[/PROTO] (TCP by default)")
}

// diagnoseTarget is what one weir diagnose run looks at.
type diagnoseTarget struct {
	node  bool   // weir diagnose node: the node checks alone
	trace bool   // weir diagnose trace: one connection
	all   bool   // --all
	name  string // namespace/name
	port  string // the port asked for, "" for every port
}

// parseDiagnoseTarget reads the command's arguments.
func parseDiagnoseTarget(args []string, all bool) (diagnoseTarget, error) {
	switch {
	case all && len(args) > 0:
		return diagnoseTarget{}, fmt.Errorf("%w: --all takes no service", errUsage)
	case all:
		return diagnoseTarget{all: true}, nil
	case len(args) != 1:
		return diagnoseTarget{}, fmt.Errorf("%w: want one of NAMESPACE/NAME[:PORT], --all, node or trace", errUsage)
	case args[0] == "node":
		return diagnoseTarget{node: true}, nil
	case args[0] == "trace":
		return diagnoseTarget{trace: true}, nil
	}
	name, port, _ := strings.Cut(args[0], ":")
	ns, n, ok := strings.Cut(name, "/")
	if !ok || ns == "" || n == "" || strings.Contains(n, "/") || (strings.Contains(args[0], ":") && port == "") {
		return diagnoseTarget{}, fmt.Errorf("%w: %q: want NAMESPACE/NAME[:PORT], --all or node", errUsage, args[0])
	}
	return diagnoseTarget{name: name, port: port}, nil
}

// runDiagnose reports, in plain sentences with stable codes, why a service
// works or does not on this node: the node, the object, its endpoints,
// the traffic policies, the plugins and the kernel's rules. It writes
// nothing; it exits 1 when a finding says traffic is lost.
func runDiagnose(env *environment) error {
	output, _ := env.flags.GetString("output")
	if output != "text" && output != "json" {
		return fmt.Errorf("%w: --output %q: use text or json", errUsage, output)
	}
	all, _ := env.flags.GetBool("all")
	target, err := parseDiagnoseTarget(env.flags.Args(), all)
	if err != nil {
		return err
	}
	if !target.trace && (env.flags.Changed("from") || env.flags.Changed("to")) {
		return fmt.Errorf("%w: --from and --to go with trace: weir diagnose trace --from ADDR --to ADDR:PORT[/PROTO]", errUsage)
	}
	ctx, cancel := signalContext()
	defer cancel()
	load, cancelLoad, err := loading(ctx, env)
	if err != nil {
		return err
	}
	defer cancelLoad()
	rep := &diagnose.Report{Mode: env.cfg.Mode, From: "source"}
	if target.trace {
		if err := diagnoseTrace(ctx, load, env, rep); err != nil {
			return err
		}
		return writeReport(env, output, rep)
	}
	nodeFindings := diagnose.CheckNode(ctx, nodeCheckOptions(env))
	if target.node {
		rep.Add(nodeFindings...)
	} else {
		rep.Add(atLeast(nodeFindings, diagnose.Warning)...)
		if err := diagnoseServices(ctx, load, env, target, rep); err != nil {
			return err
		}
	}
	return writeReport(env, output, rep)
}

// writeReport prints the report in format text or json, and fails with
// errFindings when a finding is broken.
func writeReport(env *environment, format string, rep *diagnose.Report) error {
	var err error
	if format == "json" {
		err = rep.WriteJSON(env.stdout)
	} else {
		err = rep.WriteText(env.stdout)
	}
	if err != nil {
		return err
	}
	if rep.Broken() {
		return errFindings
	}
	return nil
}

// diagnoseTrace explains one connection, --from to --to, from the plan
// computed from the source.
func diagnoseTrace(ctx, load context.Context, env *environment, rep *diagnose.Report) error {
	in, err := traceInput(env)
	if err != nil {
		return err
	}
	st, err := diagnosePlan(ctx, load, env)
	if err != nil {
		return err
	}
	in.Plan = st.final
	rep.Add(diagnose.Trace(in)...)
	return nil
}

// traceInput reads --from and --to, and the configuration's masquerade
// settings.
func traceInput(env *environment) (diagnose.TraceInput, error) {
	fromText, _ := env.flags.GetString("from")
	toText, _ := env.flags.GetString("to")
	from, err := netip.ParseAddr(fromText)
	if err != nil {
		return diagnose.TraceInput{}, fmt.Errorf("%w: trace needs --from ADDR: %q: %w", errUsage, fromText, err)
	}
	addrPort, proto, _ := strings.Cut(toText, "/")
	to, err := netip.ParseAddrPort(addrPort)
	if err != nil {
		return diagnose.TraceInput{}, fmt.Errorf("%w: trace needs --to ADDR:PORT[/PROTO]: %q: %w", errUsage, toText, err)
	}
	p := plan.Protocol(strings.ToUpper(proto))
	switch p {
	case "":
		p = plan.TCP
	case plan.TCP, plan.UDP, plan.SCTP:
	default:
		return diagnose.TraceInput{}, fmt.Errorf("%w: --to %q: protocol %q: use TCP, UDP or SCTP", errUsage, toText, proto)
	}
	c := env.cfg
	detector := c.LocalDetector.Mode
	if detector == "" {
		detector = backends.DetectClusterCIDR
	}
	return diagnose.TraceInput{From: from, To: to, Protocol: p, Mode: c.Mode, Detector: detector, ClusterCIDRs: c.ClusterCIDRs,
		PodInterface: c.LocalDetector.InterfaceNamePrefix, MasqueradeAll: c.MasqueradeAll}, nil
}

// diagnoseServices adds the findings of the service asked for, or of every
// service with warnings or worse. It reads the plan from the running
// weir's debug endpoint when one answers, and otherwise computes it from
// the source.
func diagnoseServices(ctx, load context.Context, env *environment, target diagnoseTarget, rep *diagnose.Report) error {
	objs, err := diagnoseObjects(load, env, target)
	if err != nil {
		return err
	}
	names := []string{target.name}
	if target.all {
		names = slices.Sorted(maps.Keys(objs.Services))
	}
	daemon := findDaemon(ctx, env.cfg.MetricsBindAddress)
	if daemon != nil {
		rep.From = "daemon"
		rep.Add(daemon.findings(time.Now())...)
		return daemonServices(ctx, env, daemon, objs, target, names, rep)
	}
	rep.Add(diagnose.Finding{Code: "sync.unknown", Severity: diagnose.Info, Subject: "weir",
		Message: fmt.Sprintf("no weir run answers at the metrics address %q: the plan is computed from the source, and the last sync is unknown",
			env.cfg.MetricsBindAddress)})
	st, err := diagnosePlan(ctx, load, env)
	if err != nil {
		return err
	}
	kernel := readKernel(ctx, env, st.final, rep)
	if st.pluginErr != nil {
		rep.Add(diagnose.Finding{Code: "plugins.failed", Severity: diagnose.Warning, Subject: "plugins",
			Message: "hook plugins failed and their failure policies applied: " + st.pluginErr.Error()})
	}
	flowsOf := st.finals[target.name]
	if target.all {
		flowsOf = st.final.Services
	}
	flows := readFlows(ctx, env, flowsOf, rep)
	for _, name := range names {
		in := diagnose.ServiceInput{Name: name, Port: target.port, Service: objs.Services[name], Slices: objs.Slices[name],
			Node: env.cfg.NodeName, Zone: st.final.Node.Zone, Planned: st.planned[name], Final: st.finals[name], Problems: st.problems(name),
			Changes: st.changes[name], Kernel: kernel, Flows: flows}
		found := diagnose.Service(in)
		if target.all {
			found = worthListing(found)
		}
		rep.Add(found...)
	}
	return nil
}

// daemonServices adds the findings of the named services as the running
// weir holds them, with what each plugin changed (one request, for all
// of them with --all), then one read of the kernel and of the conntrack
// table for all of them.
func daemonServices(ctx context.Context, env *environment, daemon *daemonClient, objs *files.Objects, target diagnoseTarget,
	names []string, rep *diagnose.Report) error {
	views, err := daemon.details(ctx, names, target.all)
	if err != nil {
		return fmt.Errorf("the running weir's debug endpoint: %w", err)
	}
	var finals []*plan.Service
	for _, v := range views {
		finals = append(finals, v.Final...)
	}
	all := daemon.planOf(finals)
	kernel := readKernel(ctx, env, all, rep)
	flows := readFlows(ctx, env, all.Services, rep)
	now := time.Now()
	for i, name := range names {
		v := views[i]
		in := diagnose.ServiceInput{Name: name, Port: target.port, Service: objs.Services[name], Slices: objs.Slices[name],
			Node: env.cfg.NodeName, Zone: daemon.status.PlanNode.Zone, Planned: keyed(v.Planned), Final: keyed(v.Final),
			Problems: v.Problems, Changes: v.Changes, Kernel: kernel, Flows: flows}
		found := diagnose.Service(in)
		for _, k := range slices.Sorted(maps.Keys(v.Committed)) {
			found = append(found, diagnose.Finding{Code: "sync.committed", Severity: diagnose.Info, Subject: k,
				Message: fmt.Sprintf("its rules last changed in the kernel %s ago", now.Sub(v.Committed[k]).Round(time.Second))})
		}
		if target.all {
			found = worthListing(found)
		}
		rep.Add(found...)
	}
	return nil
}

// readKernel compares the kernel's rules with want by service port; when
// it cannot, it says why in a warning and returns nil.
func readKernel(ctx context.Context, env *environment, want *plan.Plan, rep *diagnose.Report) map[plan.Key][]string {
	kernel, err := kernelDifferences(ctx, env, want)
	if err != nil {
		rep.Add(diagnose.Finding{Code: "kernel.unread", Severity: diagnose.Warning, Subject: "kernel",
			Message: "cannot read the kernel's rules, so they are not compared with the plan: " + err.Error()})
		return nil
	}
	for _, a := range kernel.anomalies {
		rep.Add(diagnose.Finding{Code: "kernel.anomaly", Severity: diagnose.Broken, Subject: "kernel", Message: a})
	}
	return kernel.byKey
}

// keyed indexes services by key.
func keyed(services []*plan.Service) map[plan.Key]*plan.Service {
	out := make(map[plan.Key]*plan.Service, len(services))
	for _, s := range services {
		out[s.Key] = s
	}
	return out
}

// worthListing returns a service's findings when one is a warning or
// worse, and none otherwise (--all lists only services with findings).
func worthListing(fs []diagnose.Finding) []diagnose.Finding {
	if len(atLeast(fs, diagnose.Warning)) == 0 {
		return nil
	}
	return fs
}

// atLeast returns the findings of severity sev or higher.
func atLeast(fs []diagnose.Finding, sev diagnose.Severity) []diagnose.Finding {
	var out []diagnose.Finding
	for _, f := range fs {
		if f.Severity >= sev {
			out = append(out, f)
		}
	}
	return out
}

// diagnoseObjects reads the Services and EndpointSlices diagnose looks at,
// whole, from the configured source.
func diagnoseObjects(ctx context.Context, env *environment, target diagnoseTarget) (*files.Objects, error) {
	switch env.cfg.Source.Kind {
	case "files":
		return files.ReadObjects(env.cfg.Source.Path, env.log)
	case "kubernetes":
		rc, err := kubernetes.Config(env.cfg.Source.Kubeconfig)
		if err != nil {
			return nil, err
		}
		client, err := k8s.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		return apiObjects(ctx, client, target)
	}
	return nil, fmt.Errorf("source.kind %q is unknown; use files or kubernetes", env.cfg.Source.Kind)
}

// apiObjects reads the Service asked for and its slices, or every Service
// and slice, from the API server.
func apiObjects(ctx context.Context, client k8s.Interface, target diagnoseTarget) (*files.Objects, error) {
	out := &files.Objects{Services: map[string]*corev1.Service{}, Slices: map[string][]*discoveryv1.EndpointSlice{}}
	ns, name := metav1.NamespaceAll, ""
	if !target.all {
		ns, name, _ = strings.Cut(target.name, "/")
	}
	var services []corev1.Service
	if name != "" {
		svc, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("get Service %s: %w", target.name, err)
		default:
			services = append(services, *svc)
		}
	} else {
		list, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Services: %w", err)
		}
		services = list.Items
	}
	for i := range services {
		out.Services[services[i].Namespace+"/"+services[i].Name] = &services[i]
	}
	opts := metav1.ListOptions{}
	if name != "" {
		opts.LabelSelector = discoveryv1.LabelServiceName + "=" + name
	}
	slices, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices: %w", err)
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		out.Slices[key] = append(out.Slices[key], s)
	}
	return out, nil
}
