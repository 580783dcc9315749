package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weirproxy/weir/test/netns"
)

// External is a proxy that runs as a process of its own and learns a row's
// objects from an API server, as kube-proxy does. RunExternal drives it
// through the table, so that every row's expectations are checked against
// that proxy's actual behaviour, not against a reading of its docs.
type External interface {
	// Name names the proxy and its mode as Differences name it, e.g.
	// "kube-proxy/nftables"; the part after the slash is the Mode whose
	// wants it must meet (Probe.ByMode).
	Name() string
	// Start creates objs in the cluster (Services, EndpointSlices and the
	// Node NodeName, as *corev1.Service, *discoveryv1.EndpointSlice and
	// *corev1.Node), starts the proxy in topo's node namespace with opts and
	// returns once the proxy has committed them. It registers with t what
	// stops the proxy and removes the objects, so that the next row starts
	// from an empty cluster.
	Start(t *testing.T, topo *netns.Topology, opts Options, objs []runtime.Object)
	// Change creates apply, or replaces the objects of the same kind,
	// namespace and name, deletes del, and returns once the proxy has
	// committed the result.
	Change(t *testing.T, apply, del []runtime.Object)
}

// Difference is a deliberate difference between Weir and another proxy for
// one probe: what that proxy gives instead of the probe's Want. Each one is
// explained in docs/semantics.md; RunExternal checks the other proxy
// against it, so the difference itself stays proven.
type Difference struct {
	// Proxy is the External's Name ("kube-proxy/nftables"), or its part
	// before the slash for every mode ("kube-proxy").
	Proxy string
	// Want is what the proxy gives.
	Want Want
	// Source is the source address the answering pod sees through that
	// proxy, as Probe.Source; "" does not check it.
	Source string
	// Why says in a few words why Weir differs, as docs/semantics.md does.
	Why string
}

// matches reports whether the difference is about the proxy named name.
func (d Difference) matches(name string) bool {
	return d.Proxy == name || strings.HasPrefix(name, d.Proxy+"/")
}

// forProxy returns the probe as the proxy named name must pass it: with
// the want of its mode (the name's part after the slash; see forMode),
// then with a Difference's want and source in place of that when one
// matches.
func (p Probe) forProxy(name string) Probe {
	_, mode, _ := strings.Cut(name, "/")
	p = p.forMode(Mode(mode))
	for _, d := range p.Differs {
		if d.matches(name) {
			p.Want, p.Source, p.Differs = d.Want, d.Source, nil
			return p
		}
	}
	p.Differs = nil
	return p
}

// RunExternal runs rows one after the other against ext, each in a fresh
// topology; the rows share ext's cluster, so they cannot run in parallel.
// A row's steps ask for no particular kind of sync: only what the probes
// see counts.
func RunExternal(t *testing.T, rows []Row, ext External) {
	for _, r := range rows {
		t.Run(r.Name, func(t *testing.T) { runExternalRow(t, r, ext) })
	}
}

func runExternalRow(t *testing.T, r Row, ext External) {
	objs := prepareRow(t, r)
	topo := netns.NewT(t, netns.Options{Pods: pods})
	for _, o := range objs {
		if o.node != nil {
			withAddresses(o.node, topo)
		}
	}
	current := map[string]object{}
	for _, o := range objs {
		current[o.key()] = o
	}
	ext.Start(t, topo, r.Options, kubeObjects(objs))
	run := &rowRun{topo: topo}
	run.probes(t, "", externalProbes(r.Probes, ext.Name()))
	for i, s := range r.Then {
		what := fmt.Sprintf("step %d (%s)", i+1, s.Name)
		apply, err := decodeManifests(s.Apply)
		if err != nil {
			t.Fatalf("%s: manifests: %v", what, err)
		}
		var del []object
		for _, name := range s.Delete {
			o, ok := current[name]
			if !ok {
				t.Fatalf("%s: delete %q: no such object", what, name)
			}
			del = append(del, o)
			delete(current, name)
		}
		for _, o := range apply {
			if o.node != nil {
				withAddresses(o.node, topo)
			}
			current[o.key()] = o
		}
		ext.Change(t, kubeObjects(apply), kubeObjects(del))
		run.probes(t, what+": ", externalProbes(s.Probes, ext.Name()))
	}
}

// prepareRow decodes a row's objects, adds the bare Node NodeName when the
// row has none (every cluster has its node's Node) and checks every probe
// of every step, failing t on a mistake in the row.
func prepareRow(t *testing.T, r Row) []object {
	t.Helper()
	objs, err := decodeManifests(r.Manifests)
	if err != nil {
		t.Fatalf("manifests: %v", err)
	}
	for _, s := range append([]Step{{Name: "initial", Probes: r.Probes}}, r.Then...) {
		for _, p := range s.Probes {
			if err := p.validate(); err != nil {
				t.Fatalf("%s: %s: %v", s.Name, p, err)
			}
		}
	}
	if !slices.ContainsFunc(objs, func(o object) bool { return o.node != nil }) {
		objs = append([]object{{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}}}, objs...)
	}
	return objs
}

// withAddresses gives a Node without addresses the topology node's, as a
// kubelet registers its Node with them: kube-proxy takes its node IPs from
// there, and waits half a minute for them when there are none.
func withAddresses(n *corev1.Node, topo *netns.Topology) {
	if len(n.Status.Addresses) > 0 {
		return
	}
	for _, a := range []netip.Addr{topo.NodeIP, topo.NodeIP6} {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
}

// kubeObjects returns the Kubernetes object each of objs holds.
func kubeObjects(objs []object) []runtime.Object {
	out := make([]runtime.Object, len(objs))
	for i, o := range objs {
		switch {
		case o.svc != nil:
			out[i] = o.svc
		case o.slice != nil:
			out[i] = o.slice
		default:
			out[i] = o.node
		}
	}
	return out
}

// externalProbes returns list as the proxy named name must pass it.
func externalProbes(list []Probe, name string) []Probe {
	out := make([]Probe, len(list))
	for i, p := range list {
		out[i] = p.forProxy(name)
	}
	return out
}
