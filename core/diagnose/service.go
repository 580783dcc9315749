package diagnose

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

// labelServiceProxyName marks a Service another proxy serves; kube-proxy,
// and Weir, leave it alone.
const labelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// ServiceInput is what diagnose knows of one Service: the objects as the
// source has them, the plan before and after the hook plugins, and what
// the kernel holds.
type ServiceInput struct {
	// Name is namespace/name.
	Name string
	// Port narrows the report to one port, by name or number; "" means
	// every port.
	Port string
	// Service is nil when the source has no such Service.
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
	// Node is this node's name, Zone its zone ("" when unknown).
	Node, Zone string
	// Planned and Final are the service's ports in the plan before and
	// after the hook plugins.
	Planned, Final map[plan.Key]*plan.Service
	// Problems are the planner's reports of the Service's or its slices'
	// bad input, which it left out.
	Problems []string
	// Changes are what each hook plugin did to the service's ports.
	Changes []PluginChange
	// Kernel holds, per port, each difference between the final plan and
	// the kernel's rules; nil when the kernel was not read.
	Kernel map[plan.Key][]string
	// Flows holds, per port, the conntrack table's entries to its
	// destinations; nil when the table was not read.
	Flows map[plan.Key][]conntrack.FlowCount
}

// PluginChange is one hook plugin's change of one service port.
type PluginChange struct {
	Plugin string        `json:"plugin"`
	Before *plan.Service `json:"before"`
	After  *plan.Service `json:"after"`
}

// Service returns the findings for one Service, object first, then each
// port's endpoints, traffic policies, plugins and kernel state.
func Service(in ServiceInput) []Finding {
	out, proceed := objectFindings(in)
	if !proceed {
		return out
	}
	keys := portKeys(in)
	if in.Port != "" && len(keys) == 0 && !specHasPort(in.Service, in.Port) {
		return append(out, Finding{Code: "service.port-not-found", Severity: Broken, Subject: in.Name,
			Message: fmt.Sprintf("the Service has no port %q (its ports: %s)", in.Port, portList(in.Service))})
	}
	for _, sp := range in.Service.Spec.Ports {
		if in.Port != "" && sp.Name != in.Port && strconv.Itoa(int(sp.Port)) != in.Port {
			continue
		}
		out = append(out, portFindings(in, sp)...)
	}
	return out
}

// objectFindings looks at the Service object and its slices as a whole;
// proceed is false when there is nothing more to look at (no Service, or
// one Weir writes no rules for by design).
func objectFindings(in ServiceInput) (out []Finding, proceed bool) {
	svc := in.Service
	add := func(code string, sev Severity, format string, args ...any) {
		out = append(out, Finding{Code: code, Severity: sev, Subject: in.Name, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case svc == nil:
		add("service.not-found", Broken, "the source has no such Service (check the namespace and the name; with the files source, the folder's manifests)")
		return out, false
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		add("service.external-name", Info, "type ExternalName: a DNS alias for %s, with no proxy rules by design", svc.Spec.ExternalName)
		return out, false
	case hasLabel(svc.Labels, labelServiceProxyName):
		add("service.other-proxy", Info, "labelled %s=%s: another proxy serves it, and Weir, like kube-proxy, writes no rules for it",
			labelServiceProxyName, svc.Labels[labelServiceProxyName])
		return out, false
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		add("service.headless", Info, "headless (clusterIP None): clients reach the pods' addresses from DNS, with no proxy rules by design")
		return out, false
	}
	add("service.summary", Info, "%s", summary(svc))
	for _, p := range in.Problems {
		add("service.bad-input", Broken, "left out as bad input: %s", p)
	}
	switch {
	case len(in.Slices) > 0:
	case len(svc.Spec.Selector) == 0:
		add("service.no-slices", Broken, "no selector and no EndpointSlice labelled kubernetes.io/service-name=%s: "+
			"a Service without a selector needs EndpointSlices written for it", svc.Name)
	default:
		add("service.no-slices", Broken, "no EndpointSlice labelled kubernetes.io/service-name=%s: the EndpointSlice controller writes "+
			"one for the pods matching the selector %s; check that such pods exist (kubectl get pods -n %s -l %s)",
			svc.Name, selectorText(svc.Spec.Selector), svc.Namespace, selectorText(svc.Spec.Selector))
	}
	return out, true
}

// portFindings looks at one port of the Service.
func portFindings(in ServiceInput, sp corev1.ServicePort) []Finding {
	keys := keysOf(in, sp)
	if len(keys) == 0 {
		return []Finding{{Code: "port.not-planned", Severity: Broken, Subject: in.Name + ":" + portLabel(sp),
			Message: "the planner wrote no rules for this port (see the bad input above, or the Service has no cluster IP)"}}
	}
	var out []Finding
	for _, k := range keys {
		subject := k.String()
		if f, ok := namedPortUnresolved(in, sp, subject); ok {
			out = append(out, f)
		}
		planned := in.Planned[k]
		counts := sliceCounts(in.Slices, sp.Name, in.Node, in.Zone)
		out = append(out, endpointFindings(subject, in.Node, in.Zone, counts, planned)...)
		out = append(out, policyFindings(subject, planned)...)
		out = append(out, pluginFindings(subject, planned, in.Final[k], in.Changes)...)
		out = append(out, kernelFindings(subject, in.Kernel, k)...)
		if in.Flows != nil {
			out = append(out, flowFindings(subject, k.Protocol, in.Flows[k])...)
		}
	}
	return out
}

// namedPortUnresolved finds a named target port that no endpoint
// resolves: the EndpointSlice controller then lists the pods without that
// port, and the Service port has no endpoints.
func namedPortUnresolved(in ServiceInput, sp corev1.ServicePort, subject string) (Finding, bool) {
	if sp.TargetPort.Type != intstr.String || len(in.Slices) == 0 {
		return Finding{}, false
	}
	for _, s := range in.Slices {
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == sp.Name && p.Port != nil && len(s.Endpoints) > 0 {
				return Finding{}, false
			}
		}
	}
	return Finding{Code: "port.named-target-unresolved", Severity: Broken, Subject: subject,
		Message: fmt.Sprintf("targetPort %q is a name that no endpoint resolves: no pod behind the Service declares a container port named %q, "+
			"so the EndpointSlices list no port %q and the port has no endpoints", sp.TargetPort.StrVal, sp.TargetPort.StrVal, sp.Name)}, true
}

// kernelFindings reports the differences between the final plan and the
// kernel, or that there are none.
func kernelFindings(subject string, kernel map[plan.Key][]string, k plan.Key) []Finding {
	if kernel == nil {
		return nil
	}
	diffs := kernel[k]
	if len(diffs) == 0 {
		return []Finding{{Code: "kernel.in-sync", Severity: Info, Subject: subject, Message: "the kernel's rules match the plan"}}
	}
	out := make([]Finding, 0, len(diffs))
	for _, d := range diffs {
		out = append(out, Finding{Code: "kernel.differs", Severity: Broken, Subject: subject,
			Message: "the kernel differs from the plan: " + d + " (weir run repairs it at its next sync; if it comes back, something else writes these rules)"})
	}
	return out
}

// summary describes the Service's type, addresses and ports.
func summary(svc *corev1.Service) string {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var ports []string
	for _, sp := range svc.Spec.Ports {
		p := fmt.Sprintf("%s → %s", portLabel(sp), sp.TargetPort.String())
		if sp.NodePort != 0 {
			p += fmt.Sprintf(" (node port %d)", sp.NodePort)
		}
		ports = append(ports, p)
	}
	s := fmt.Sprintf("type %s, cluster IP %s, ports %s", svc.Spec.Type, strings.Join(ips, ", "), strings.Join(ports, "; "))
	if len(svc.Spec.Selector) > 0 {
		s += ", selector " + selectorText(svc.Spec.Selector)
	}
	return s
}

// portKeys returns the planned keys of the port asked for, or of every port.
func portKeys(in ServiceInput) []plan.Key {
	var keys []plan.Key
	for _, sp := range in.Service.Spec.Ports {
		if in.Port == "" || sp.Name == in.Port || strconv.Itoa(int(sp.Port)) == in.Port {
			keys = append(keys, keysOf(in, sp)...)
		}
	}
	return keys
}

// keysOf returns the planned keys of one Service port, sorted.
func keysOf(in ServiceInput, sp corev1.ServicePort) []plan.Key {
	proto := plan.Protocol(sp.Protocol)
	if proto == "" {
		proto = plan.TCP
	}
	k := plan.Key{Namespace: in.Service.Namespace, Name: in.Service.Name, Port: sp.Name, Protocol: proto}
	if _, ok := in.Planned[k]; ok {
		return []plan.Key{k}
	}
	return nil
}

func specHasPort(svc *corev1.Service, port string) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
		return sp.Name == port || strconv.Itoa(int(sp.Port)) == port
	})
}

func portList(svc *corev1.Service) string {
	var parts []string
	for _, sp := range svc.Spec.Ports {
		parts = append(parts, portLabel(sp))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// portLabel names a Service port as name (number/protocol).
func portLabel(sp corev1.ServicePort) string {
	proto := sp.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	if sp.Name == "" {
		return fmt.Sprintf("%d/%s", sp.Port, proto)
	}
	return fmt.Sprintf("%s (%d/%s)", sp.Name, sp.Port, proto)
}

func selectorText(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	return strings.Join(parts, ",")
}

func hasLabel(labels map[string]string, name string) bool {
	_, ok := labels[name]
	return ok
}
