// Package conformance is the kernel conformance table every Weir backend
// runs: one row per Service behaviour, each with the Kubernetes objects that
// ask for it and the connections that prove the kernel does it.
//
// A row builds a fresh test/netns topology (a node namespace, a client
// namespace and the pods pod-a 10.244.0.11, pod-b 10.244.0.12 and pod-c
// 10.244.0.13, each serving TCP and UDP on ports 8080 and 53), creates the
// backend under test in the node namespace, feeds the row's manifests through
// a real core/proxy.Proxy (node name "node-a", clearing stale UDP conntrack
// entries with core/conntrack as weir run does) and syncs in full. Then it
// dials the row's probes from the client, the node or a pod and checks which
// pods answer and which source address they saw. Optional steps change
// objects, sync again (partially, unless the step asks for a full sync) and
// probe again. The planner's semantics are therefore exercised end to end,
// together with the backend's.
//
// Locality is what the EndpointSlices say: an endpoint whose nodeName is
// node-a is local, one on node-b is remote, although every pod namespace
// hangs off the one node namespace and traffic physically reaches them all.
//
// A backend's test runs the table with Run, naming the proxy mode it
// implements (see Mode):
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.NFTables, func(t *testing.T, fd int, opts conformance.Options) backends.Backend {
//			b, err := mybackend.New(fd, opts.ClusterCIDRs, opts.MasqueradeAll)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { b.Close() })
//			return b
//		})
//	}
//
// Creating namespaces needs root; without it the rows skip, except under
// CI=true, where they fail (see netns.RequireRoot).
package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// NodeName is the name of the node the proxy runs as; endpoints whose
// nodeName is NodeName are local.
const NodeName = "node-a"

// The pods of every row's topology: netns.ThreePods, dual-stack, each
// serving 8080 and 53 over TCP and UDP.
var pods = netns.ThreePods(netns.DualStack("pod-a", "pod-b", "pod-c"), netns.ServePorts(8080, 53))

// syncTimeout bounds one proxy sync.
const syncTimeout = 30 * time.Second

// Options is what a backend needs from Weir's configuration for a row.
type Options struct {
	// ClusterCIDRs are the pod ranges: cluster-IP traffic from elsewhere is
	// masqueraded. Empty means nothing is detected as pod traffic.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all cluster-IP traffic.
	MasqueradeAll bool
}

// Mode is a proxy mode: Weir's backend of that name and kube-proxy in that
// mode. A probe's want may depend on it where kube-proxy's modes differ
// (Probe.ByMode).
type Mode string

// The modes, named as kube-proxy names them.
const (
	NFTables Mode = "nftables"
	IPTables Mode = "iptables"
	IPVS     Mode = "ipvs"
)

// modes lists every Mode.
var modes = []Mode{NFTables, IPTables, IPVS}

// NewBackend creates the backend under test, programming the network
// namespace netnsFd; it fails the test itself when it cannot, and registers
// its own cleanup (closing sockets and the like) with t. Rows run in
// parallel, so it is called concurrently, each time for another namespace.
type NewBackend func(t *testing.T, netnsFd int, opts Options) backends.Backend

// Row is one conformance case: objects, configuration, probes, and optional
// later steps.
type Row struct {
	// Name names the subtest; short and kebab-case, e.g. "nodeport".
	Name string
	// Manifests are the row's Kubernetes objects as multi-document YAML:
	// Services, EndpointSlices and optionally the Node node-a.
	Manifests string
	// Options is the configuration the backend is created with.
	Options Options
	// Probes run after the first, full, sync.
	Probes []Probe
	// Then are steps run in order after the probes.
	Then []Step
}

// Step changes the row's objects, syncs and probes again.
type Step struct {
	// Name says what the step does, for failure messages.
	Name string
	// Apply holds objects (multi-document YAML) that are created, or that
	// replace the object of the same kind, namespace and name.
	Apply string
	// Delete names objects to delete, as "Kind namespace/name" (or
	// "Node name").
	Delete []string
	// Full asks for a full sync; by default the step syncs only what
	// changed, and the row fails if the proxy sends the backend a full sync.
	Full bool
	// Probes run after the sync.
	Probes []Probe
}

// Run runs every row of the table, each as a parallel subtest, against a
// backend of the given mode.
func Run(t *testing.T, mode Mode, newBackend NewBackend) {
	RunRows(t, mode, Rows(), newBackend)
}

// RunFlavours runs every row once per flavour (iptables-nft and legacy,
// say), each as a subtest named after the flavour; newBackend returns the
// constructor for one flavour.
func RunFlavours(t *testing.T, mode Mode, flavours []string, newBackend func(flavour string) NewBackend) {
	for _, fl := range flavours {
		t.Run(fl, func(t *testing.T) { Run(t, mode, newBackend(fl)) })
	}
}

// RunRows runs the given rows, each as a parallel subtest, against a
// backend of the given mode; a backend may use it to run a subset of the
// table or rows of its own.
func RunRows(t *testing.T, mode Mode, rows []Row, newBackend NewBackend) {
	names := map[string]bool{}
	for _, r := range rows {
		if names[r.Name] {
			t.Fatalf("conformance: two rows are named %q", r.Name)
		}
		names[r.Name] = true
	}
	for _, r := range rows {
		t.Run(r.Name, func(t *testing.T) {
			t.Parallel()
			runRow(t, mode, r, newBackend)
		})
	}
}

// rowRun is the state of one running row.
type rowRun struct {
	// mode picks each probe's want (Probe.ByMode).
	mode    Mode
	topo    *netns.Topology
	proxy   *proxy.Proxy
	backend *recorder
	objects *store
	log     *warnings
}

func runRow(t *testing.T, mode Mode, r Row, newBackend NewBackend) {
	objs := prepareRow(t, r)
	topo := netns.NewT(t, netns.Options{Pods: pods})
	rec := &recorder{Backend: newBackend(t, topo.Node.Fd(), r.Options)}
	log := &warnings{}
	logger := slog.New(log.handler(slog.NewTextHandler(t.Output(), nil)))
	// The proxy clears stale UDP flows after each commit, as weir run does.
	ct, err := conntrack.New(topo.Node.Fd(), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ct.Close() })
	run := &rowRun{
		mode:    mode,
		topo:    topo,
		backend: rec,
		objects: newStore(),
		log:     log,
		proxy:   proxy.New(proxy.Options{NodeName: NodeName, Backend: rec, Conntrack: ct, Log: logger}),
	}
	h := run.proxy.Handler()
	for _, o := range objs {
		run.objects.apply(h, o)
	}
	h.OnSynced()
	run.sync(t, "initial sync", true)
	run.probes(t, "", r.Probes)
	for i, s := range r.Then {
		run.step(t, fmt.Sprintf("step %d (%s)", i+1, s.Name), s)
	}
	run.cleanup(t, r)
}

// step applies one step's changes, syncs and runs its probes.
func (r *rowRun) step(t *testing.T, what string, s Step) {
	t.Helper()
	objs, err := decodeManifests(s.Apply)
	if err != nil {
		t.Fatalf("%s: manifests: %v", what, err)
	}
	h := r.proxy.Handler()
	for _, o := range objs {
		r.objects.apply(h, o)
	}
	for _, name := range s.Delete {
		if err := r.objects.delete(h, name); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	r.sync(t, what, s.Full)
	r.probes(t, what+": ", s.Probes)
}

// sync runs one proxy sync and checks that it went as asked and that the
// proxy found nothing wrong with the row's objects.
func (r *rowRun) sync(t *testing.T, what string, full bool) {
	t.Helper()
	before := r.backend.calls()
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if err := r.proxy.Sync(ctx, full); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if w := r.log.take(); len(w) > 0 {
		t.Errorf("%s: the proxy warned about the row's objects (fix the row):\n%s", what, strings.Join(w, "\n"))
	}
	calls := r.backend.calls()
	switch {
	case len(calls) == len(before):
		if full {
			t.Fatalf("%s: the proxy did not call the backend", what)
		}
		t.Logf("%s: nothing changed in the plan; the backend was not called", what)
	case !full && calls[len(calls)-1].Full:
		t.Errorf("%s: the proxy sent a full sync; the step wanted a partial one", what)
	}
}

// cleanup removes the backend's rules and checks that the first address the
// row saw answered no longer reaches any pod.
func (r *rowRun) cleanup(t *testing.T, row Row) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if err := r.backend.Cleanup(ctx); err != nil {
		t.Errorf("backend cleanup: %v", err)
		return
	}
	i := slices.IndexFunc(row.Probes, func(p Probe) bool { return len(p.forMode(r.mode).Want.pods) > 0 })
	if i < 0 {
		return
	}
	p := row.Probes[i].forMode(r.mode)
	// A fresh flow: an old one would keep its translation in conntrack.
	p.Count, p.Want, p.Source, p.FromPort = 1, Unanswered, "", 0
	r.probe(t, "after Backend.Cleanup: ", p)
}

// recorder passes syncs to the backend under test and remembers, for each,
// the request it carried.
type recorder struct {
	backends.Backend
	mu   sync.Mutex
	reqs []backends.SyncRequest
}

// Sync records the call and forwards it.
func (r *recorder) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	r.mu.Lock()
	r.reqs = append(r.reqs, backends.SyncRequest{Full: req.Full, Changed: slices.Clone(req.Changed)})
	r.mu.Unlock()
	return r.Backend.Sync(ctx, p, req)
}

// calls returns the request of every call so far.
func (r *recorder) calls() []backends.SyncRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// warnings collects the proxy's warnings, which for a row's hand-written
// objects mean a mistake in the row.
type warnings struct {
	mu   sync.Mutex
	list []string
}

// handler wraps h so that warnings are also collected.
func (w *warnings) handler(h slog.Handler) slog.Handler { return warnHandler{h, w} }

// take returns the warnings collected since the last call.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// warnHandler is a slog handler that records warnings before passing them on.
type warnHandler struct {
	slog.Handler
	w *warnings
}

// Handle records records at warning level or above and forwards all.
func (h warnHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		var b strings.Builder
		b.WriteString(rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		h.w.mu.Lock()
		h.w.list = append(h.w.list, b.String())
		h.w.mu.Unlock()
	}
	return h.Handler.Handle(ctx, rec)
}

// WithAttrs keeps recording warnings.
func (h warnHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnHandler{h.Handler.WithAttrs(attrs), h.w}
}

// WithGroup keeps recording warnings.
func (h warnHandler) WithGroup(name string) slog.Handler {
	return warnHandler{h.Handler.WithGroup(name), h.w}
}
