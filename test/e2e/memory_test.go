//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/compare"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
	"github.com/weirproxy/weir/test/scale"
)

// The memory test's knobs, from the environment.
const (
	// memoryServicesEnv is how many services to load (default 1000).
	memoryServicesEnv = "WEIRTEST_MEMORY_SERVICES"
	// memorySettleEnv is how long after the first sync steady RSS is read
	// (a duration; default 60s).
	memorySettleEnv = "WEIRTEST_MEMORY_SETTLE"
	// memoryBaselineEnv names another weir binary, measured first in the
	// same conditions (before and after a change, in one run).
	memoryBaselineEnv = "WEIRTEST_MEMORY_BASELINE"
	// memoryOutEnv names a directory for each run's heap profile.
	memoryOutEnv = "WEIRTEST_MEMORY_OUT"
	// memoryTraceEnv, set to 1 with WEIRTEST_MEMORY_OUT, adds a last start
	// of weir, not measured, whose first seconds are saved as a Go
	// execution trace and a CPU profile: where the time to the first sync
	// goes.
	memoryTraceEnv = "WEIRTEST_MEMORY_TRACE"
)

// memoryNamespace holds the load; memoryNode is the Node Weir runs as.
const (
	memoryNamespace = "memory-load"
	memoryNode      = "node-0"
	memoryEndpoints = 10
)

// TestMemoryKubernetesSource measures `weir run` with the kubernetes
// source as deploy/kubernetes runs it (GOMEMLIMIT from the DaemonSet's
// memory limit, Weir's ServiceAccount and RBAC) against a real control
// plane holding WEIRTEST_MEMORY_SERVICES services of test/scale's mix,
// each with an EndpointSlice of 10 endpoints written as the EndpointSlice
// controller writes them (owner reference, managed-by label, trigger time,
// targetRefs to pods). It reports, per binary: process start to the first
// "Synced rules" (the informers' initial lists and the first full sync),
// peak RSS (VmHWM) then, steady RSS (VmRSS after WEIRTEST_MEMORY_SETTLE)
// and the heap in use after a forced GC; the kernel is checked with weir
// verify. It fails when Weir does not sync, when verify finds a divergence,
// or when the peak goes over the DaemonSet's memory limit (the kubelet
// would kill the pod). The targets of issue 17 (2 s, 150 MB peak, 100 MB
// steady at 10k) are reported, not enforced: they depend on the machine.
func TestMemoryKubernetesSource(t *testing.T) {
	netns.RequireRoot(t)
	n := memoryEnvInt(t, memoryServicesEnv, 1000)
	settle := memoryEnvDuration(t, memorySettleEnv, 60*time.Second)
	limit := memoryDaemonSetLimit(t)
	bin := weirBinary(t)
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, false)
	cp.CreateNamespace(t, memoryNamespace)
	client := memoryClient(t, cp)
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: memoryNode, Labels: map[string]string{corev1.LabelHostname: memoryNode}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := memoryLoad(ctx, client, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d services × %d endpoints through the API in %v", n, memoryEndpoints, time.Since(start).Round(time.Second))

	binaries := []string{bin}
	if base := os.Getenv(memoryBaselineEnv); base != "" {
		binaries = []string{base, bin}
	}
	t.Setenv("GOMEMLIMIT", strconv.FormatInt(limit, 10))
	for i, b := range binaries {
		m := memoryMeasure(t, cp, b, fmt.Sprintf("run%d", i), n, settle)
		t.Logf("%s at %d × %d (GOMEMLIMIT %d MiB, the DaemonSet's limit): start → first sync %v (its full sync %s); peak RSS %d MiB; steady RSS %d MiB after %v (anonymous %d MiB, the binary's pages %d MiB); heap in use %d MiB",
			b, n, memoryEndpoints, limit>>20, m.firstSync.Round(time.Millisecond), m.syncDuration, m.peak>>20, m.steady>>20, settle,
			m.steadyAnon>>20, m.steadyFile>>20, m.heap>>20)
		t.Logf("the Go runtime's share of the anonymous memory then: %s", m.runtime)
		if n == 10000 {
			t.Logf("issue 17 targets at 10k: start → first sync ≤ 2 s: %s; peak ≤ 150 MB: %s; steady ≤ 100 MB: %s",
				memoryVerdict(m.firstSync <= 2*time.Second), memoryVerdict(m.peak <= 150e6), memoryVerdict(m.steady <= 100e6))
		}
		if m.peak > limit {
			t.Errorf("%s: peak RSS %d MiB is over the DaemonSet's memory limit %d MiB", b, m.peak>>20, limit>>20)
		}
	}
	if dir := os.Getenv(memoryOutEnv); dir != "" && os.Getenv(memoryTraceEnv) == "1" {
		memoryTraceStart(t, cp, bin, dir, n)
	}
}

// memoryTraceStart starts bin once more and saves a Go execution trace
// and a CPU profile of its first five seconds (from the moment its
// metrics server answers, a few milliseconds after the process starts) to
// dir, with the daemon's log beside them.
func memoryTraceStart(t *testing.T, cp *controlplane.ControlPlane, bin, dir string, n int) {
	t.Helper()
	topo := netns.NewT(t, netns.Options{})
	forwardAPIServer(t, cp, topo.Node)
	d := runWeirBinary(t, topo.Node, "traced", bin, false, weirArgs(t, cp, memoryNode, "--profiling")...)
	metrics := "http://" + d.serving(t, "metricsBindAddress")
	c := topo.Node.HTTPClient(30 * time.Second)
	kinds := []string{"trace", "profile"}
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, what := range kinds {
		wg.Go(func() {
			errs[i] = memorySave(c, metrics+"/debug/pprof/"+what+"?seconds=5", filepath.Join(dir, fmt.Sprintf("start-%s-%d.out", what, n)))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the traced weir to sync", func() bool {
		d.mustRun(t)
		return memorySyncedLine.MatchString(d.out.String())
	})
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("start-log-%d.txt", n)), []byte(d.out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	d.stop(t)
	t.Logf("trace, CPU profile and log of a start saved in %s", dir)
}

func memoryVerdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// memoryResult is what one run measured.
type memoryResult struct {
	firstSync          time.Duration // process start to the first "Synced rules"
	syncDuration       string        // that sync's own duration, as logged
	peak, steady, heap int64         // bytes
	// steadyAnon and steadyFile split steady RSS into anonymous memory
	// (the Go heap, stacks, the runtime's own) and pages of the binary.
	steadyAnon, steadyFile int64
	// runtime lists the Go runtime's memory beside the heap in use (idle
	// heap not yet returned, stacks, the collector's metadata), from the
	// metrics.
	runtime string
}

// memorySyncedLine is weir's log line of a committed sync, with its duration.
var memorySyncedLine = regexp.MustCompile(`msg="Synced rules".* duration=(\S+)`)

// memoryMeasure runs bin in a node namespace of its own until the first
// sync and settle after it, and returns what it measured.
func memoryMeasure(t *testing.T, cp *controlplane.ControlPlane, bin, name string, n int, settle time.Duration) memoryResult {
	t.Helper()
	topo := netns.NewT(t, netns.Options{})
	forwardAPIServer(t, cp, topo.Node)
	args := weirArgs(t, cp, memoryNode, "--profiling")
	var r memoryResult
	start := time.Now()
	d := runWeirBinary(t, topo.Node, name, bin, false, args...)
	var found []string
	poll(t, 5*time.Minute, "weir on "+name+" to sync", func() bool {
		d.mustRun(t)
		found = memorySyncedLine.FindStringSubmatch(d.out.String())
		return found != nil
	})
	r.firstSync = time.Since(start)
	r.syncDuration = found[1]
	r.peak = memoryStatus(t, d.process.Pid, "VmHWM")
	out := memoryRun(t, topo.Node, bin, "verify", "--kubeconfig", weirKubeconfig(t, cp, memoryNode), "--source-kind", "kubernetes",
		"--node-name", memoryNode, "--cluster-cidrs", netns.DefaultPodCIDR.String(), "--log-level", "warn")
	t.Logf("weir verify on %s: %s", name, strings.TrimSpace(out))
	time.Sleep(settle)
	r.steady = memoryStatus(t, d.process.Pid, "VmRSS")
	r.steadyAnon, r.steadyFile = memoryStatus(t, d.process.Pid, "RssAnon"), memoryStatus(t, d.process.Pid, "RssFile")
	metrics := "http://" + d.serving(t, "metricsBindAddress")
	c := topo.Node.HTTPClient(30 * time.Second)
	if dir := os.Getenv(memoryOutEnv); dir != "" {
		memoryFetch(t, c, metrics+"/debug/pprof/heap?gc=1", filepath.Join(dir, fmt.Sprintf("heap-%s-%d.pb.gz", name, n)))
	} else {
		memoryFetch(t, c, metrics+"/debug/pprof/heap?gc=1", "")
	}
	page := string(memoryFetch(t, c, metrics+"/metrics", ""))
	r.heap = memoryMetric(t, page, "go_memstats_heap_inuse_bytes")
	idle := memoryMetric(t, page, "go_memstats_heap_idle_bytes") - memoryMetric(t, page, "go_memstats_heap_released_bytes")
	r.runtime = fmt.Sprintf("idle heap kept %d MiB, stacks %d MiB, GC metadata %d MiB, spans %d MiB, other %d MiB", idle>>20,
		memoryMetric(t, page, "go_memstats_stack_inuse_bytes")>>20, memoryMetric(t, page, "go_memstats_gc_sys_bytes")>>20,
		memoryMetric(t, page, "go_memstats_mspan_inuse_bytes")>>20, memoryMetric(t, page, "go_memstats_other_sys_bytes")>>20)
	d.stop(t)
	return r
}

// memoryRun runs bin with args in node and returns its output; it fails
// the test unless bin succeeds.
func memoryRun(t *testing.T, node *netns.Namespace, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := node.Command(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("weir %s: %v\n%s", args[0], err, out)
	}
	return string(out)
}

// memoryStatus reads a field of /proc/pid/status, in bytes.
func memoryStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// memoryFetch gets url and saves the body to path, unless path is empty.
func memoryFetch(t *testing.T, c *http.Client, url, path string) []byte {
	t.Helper()
	body, err := memoryGet(c, url)
	if err != nil {
		t.Fatal(err)
	}
	if path != "" {
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return body
}

// memorySave gets url and saves the body to path.
func memorySave(c *http.Client, url, path string) error {
	body, err := memoryGet(c, url)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// memoryGet returns the body of a successful GET of url.
func memoryGet(c *http.Client, url string) ([]byte, error) {
	res, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return body, nil
}

// memoryMetric reads one unlabelled metric from a /metrics page.
func memoryMetric(t *testing.T, page, name string) int64 {
	t.Helper()
	for line := range strings.Lines(page) {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return int64(v)
		}
	}
	t.Fatalf("no metric %s on the metrics page", name)
	return 0
}

// memoryDaemonSetLimit returns the memory limit of deploy/kubernetes's
// Weir container, in bytes, and checks that GOMEMLIMIT comes from it.
func memoryDaemonSetLimit(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(raw, &ds); err != nil {
		t.Fatal(err)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	q, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatalf("the DaemonSet's container %s has no memory limit", c.Name)
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			return q.Value()
		}
	}
	t.Fatalf("the DaemonSet's container %s does not set GOMEMLIMIT from limits.memory", c.Name)
	return 0
}

func memoryEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func memoryEnvDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// memoryClient is a client for the load: protobuf, without client-side
// rate limits.
func memoryClient(t *testing.T, cp *controlplane.ControlPlane) kubernetes.Interface {
	t.Helper()
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = 5000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.WarningHandler = rest.NoWarnings{}
	return kubernetesClient(t, rc)
}

// memoryNodePorts is the size of the API server's default node port range.
const memoryNodePorts = 2768

// memoryLoad writes services 0 to n-1 and their slices with 16 writers.
func memoryLoad(ctx context.Context, c kubernetes.Interface, n int) error {
	services := make([]*corev1.Service, n)
	sliceObjs := make([]*discoveryv1.EndpointSlice, n)
	left := memoryNodePorts
	for i := range n {
		svc, slice, err := memoryObjects(i)
		if err != nil {
			return err
		}
		left -= compare.FitNodePorts(svc, left)
		services[i], sliceObjs[i] = svc, slice
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for w := range errs {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil; i = int(next.Add(1) - 1) {
				errs[w] = memoryCreate(ctx, c, services[i], sliceObjs[i])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// memoryObjects returns service i of test/scale with what the API server
// allocates cleared, and its slice as the EndpointSlice controller writes
// one (its owner reference is set once the Service exists).
func memoryObjects(i int) (*corev1.Service, *discoveryv1.EndpointSlice, error) {
	svcDoc, sliceDoc, _ := strings.Cut(string(scale.Manifest(i, memoryEndpoints, 0)), "\n---\n")
	svc := &corev1.Service{}
	slice := &discoveryv1.EndpointSlice{}
	if err := yaml.UnmarshalStrict([]byte(svcDoc), svc); err != nil {
		return nil, nil, err
	}
	if err := yaml.UnmarshalStrict([]byte(sliceDoc), slice); err != nil {
		return nil, nil, err
	}
	svc.Namespace, slice.Namespace = memoryNamespace, memoryNamespace
	svc.Spec.ClusterIP = ""
	for j := range svc.Spec.Ports {
		svc.Spec.Ports[j].NodePort = 0
	}
	slice.Labels["endpointslice.kubernetes.io/managed-by"] = "memory-test.weir"
	slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339)}
	yes, no := true, false
	for j := range slice.Endpoints {
		e := &slice.Endpoints[j]
		e.Conditions = discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no}
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: memoryNamespace,
			Name: fmt.Sprintf("svc-%d-7d9f8b6c5-%05d", i, j), UID: types.UID(fmt.Sprintf("0e3c5f2a-%04x-4d6b-9a51-%012x", j, i))}
	}
	return svc, slice, nil
}

// memoryCreate creates svc (and its load-balancer status) and its slice.
func memoryCreate(ctx context.Context, c kubernetes.Interface, svc *corev1.Service, slice *discoveryv1.EndpointSlice) error {
	created, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = c.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		created.Status = svc.Status
		if created, err = c.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("load balancer status of %s: %w", svc.Name, err)
		}
	}
	yes := true
	slice.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: created.Name, UID: created.UID,
		Controller: &yes, BlockOwnerDeletion: &yes}}
	if _, err := c.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create endpointslice %s: %w", slice.Name, err)
	}
	return nil
}
