// Package difftest is Weir's differential test against kube-proxy: seeded
// scenarios of valid Services and EndpointSlices, written through a real
// control plane, served in turn by the real kube-proxy and by Weir on
// identical node namespaces (test/netns), and probed the same way from a
// client outside the node, from the node itself and from pods (hairpin
// included). Outcomes are compared probe by probe: which pods answered and
// which source they saw, or how the attempts failed (refused, dropped, an
// error of the sender), and whether a ClientIP-affinity service stuck to
// one pod. kube-proxy also runs a second time on the same objects, the
// noise floor: a probe on which kube-proxy disagrees with itself does not
// count against Weir, and a seed with any such probe is reported as noisy.
//
// Conformance rows (test/conformance) hold the cases somebody thought of;
// the generator finds the ones nobody wrote. Each disagreement prints the
// objects of its service and both outcomes, ready to become a row.
//
//	cfg := difftest.Config{Weir: "bin/weir", KubeProxy: bins.KubeProxy, Dir: dir}
//	rep, err := difftest.RunSeed(ctx, cp, cfg, seed, "nftables")
package difftest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/netns"
)

// The fixed world every scenario lives in.
const (
	// NodeName is the node both proxies run as; endpoints on it are local.
	NodeName = "node-a"
	// otherNode is where remote endpoints live (physically the same pods).
	otherNode = "node-b"
	// namespace holds every generated object.
	namespace = "default"
	zoneA     = "zone-a"
	zoneB     = "zone-b"
	// managedBy marks the generated EndpointSlices, which the EndpointSlice
	// controller leaves alone (the Services have no selector anyway).
	managedBy = "difftest.weir.dev"
)

// pod is one of the pods every topology has, serving TCP and UDP on each
// of servedPorts.
type pod struct {
	name string
	ip   netip.Addr
}

var pods = []pod{{"pod-a", netns.PodA}, {"pod-b", netns.PodB}, {"pod-c", netns.PodC}}

// servedPorts are the ports every pod answers on; endpoints use only these,
// so every attempt a proxy sends to an endpoint is answered.
var servedPorts = []int32{8080, 53}

// podSpecs returns the pods of a topology.
func podSpecs() []netns.PodSpec {
	ports := make([]uint16, len(servedPorts))
	for i, p := range servedPorts {
		ports[i] = uint16(p)
	}
	return netns.ThreePods(netns.ServePorts(ports...))
}

// podOf returns the name of the pod at ip, or "".
func podOf(ip string) string {
	for _, p := range pods {
		if p.ip.String() == ip {
			return p.name
		}
	}
	return ""
}

// Scenario is one generated cluster state: this node's Node, the Services
// and their EndpointSlices, all in namespace default.
type Scenario struct {
	// Seed is what Generate was given.
	Seed     int64
	Node     *corev1.Node
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
}

// slicesOf returns the EndpointSlices labelled with the service's name.
func (sc *Scenario) slicesOf(name string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, s := range sc.Slices {
		if s.Labels[discoveryv1.LabelServiceName] == name {
			out = append(out, s)
		}
	}
	return out
}

// Manifests returns the objects of the named services (every service when
// names is empty), their slices and the Node, as multi-document YAML in
// the form test/conformance rows take.
func (sc *Scenario) Manifests(names ...string) string {
	var docs []string
	add := func(kind, apiVersion string, obj any) {
		b, err := yaml.Marshal(obj)
		if err != nil {
			panic(fmt.Sprintf("difftest: marshal %s: %v", kind, err))
		}
		docs = append(docs, "apiVersion: "+apiVersion+"\nkind: "+kind+"\n"+string(b))
	}
	add("Node", "v1", bare(sc.Node))
	for _, s := range sc.Services {
		if len(names) == 0 || slices.Contains(names, s.Name) {
			add("Service", "v1", bare(s))
			for _, sl := range sc.slicesOf(s.Name) {
				add("EndpointSlice", "discovery.k8s.io/v1", bare(sl))
			}
		}
	}
	return strings.Join(docs, "---\n")
}

// bare returns a copy of obj without what the API server fills in, for
// printing.
func bare(obj any) any {
	switch o := obj.(type) {
	case *corev1.Node:
		c := o.DeepCopy()
		c.ObjectMeta = cleanMeta(c.ObjectMeta)
		return c
	case *corev1.Service:
		c := o.DeepCopy()
		c.ObjectMeta = cleanMeta(c.ObjectMeta)
		return c
	case *discoveryv1.EndpointSlice:
		c := o.DeepCopy()
		c.ObjectMeta = cleanMeta(c.ObjectMeta)
		return c
	}
	return obj
}

func cleanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations}
}
