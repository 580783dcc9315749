//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
)

// podPort is the port every netns pod serves, the port named http of
// readyPod's container.
const podPort = 8080

// dial makes one TCP connection from ns to addr within limit.
func dial(ns *netns.Namespace, addr netip.AddrPort, limit time.Duration) (netns.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	return ns.DialTCP(ctx, addr)
}

// probeRun is how many consecutive connections must agree before a set of
// pods counts as what a service sends to: enough that each of three
// equally likely pods answers with near certainty (missing one has odds
// of about 3·(2/3)^30 ≈ 2e-5).
const probeRun = 30

// setDial bounds each of waitSet's connections. A SYN sent before the
// rules exist is lost (the node routes it back to the client, which drops
// it) and the kernel would retry it only after a second, so a longer
// bound would add up to a second to every latency measured; a healthy
// connection takes a few milliseconds.
const setDial = 250 * time.Millisecond

// waitSet connects from ns to addr, one connection after another, until
// probeRun connections in a row are answered by pods in want and every pod
// in want answered among them. It returns when the first connection of
// that run started, and fails the test after limit.
func waitSet(t *testing.T, d *weirDaemon, ns *netns.Namespace, addr netip.AddrPort, limit time.Duration, want ...string) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	var runStart time.Time
	seen := map[string]int{}
	run, last := 0, "no connection yet"
	for time.Now().Before(deadline) {
		d.mustRun(t)
		start := time.Now()
		a, err := dial(ns, addr, setDial)
		switch {
		case err != nil:
			run, last = 0, err.Error()
			time.Sleep(10 * time.Millisecond) // not yet served: do not spin on refusals
			continue
		case !slices.Contains(want, a.Pod):
			run, last = 0, a.String()
			continue
		}
		if run == 0 {
			runStart, seen = start, map[string]int{}
		}
		run++
		seen[a.Pod]++
		if run >= probeRun && len(seen) == len(want) {
			return runStart
		}
	}
	t.Fatalf("%s from %s: no run of %d connections answered by exactly %v within %v; last: %s",
		addr, ns.Name, probeRun, want, limit, last)
	return time.Time{}
}

// keepPace is the interval between keepServing's connections: a steady
// trickle rather than thousands a second, which would soon reuse source
// ports whose earlier connections the pod still holds in TIME_WAIT.
const keepPace = 10 * time.Millisecond

// keepServing connects from ns to addr every keepPace for the whole of
// span and fails the test unless every connection is answered by a pod in
// want. Each connection may take 3 s, time for one retransmitted SYN. It
// returns the number of connections made.
func keepServing(t *testing.T, d *weirDaemon, ns *netns.Namespace, addr netip.AddrPort, span time.Duration, want ...string) int {
	t.Helper()
	tick := time.NewTicker(keepPace)
	defer tick.Stop()
	n := 0
	for end := time.Now().Add(span); time.Now().Before(end); n++ {
		<-tick.C
		d.mustRun(t)
		a, err := dial(ns, addr, 3*time.Second)
		if err != nil {
			t.Fatalf("connection %d to %s from %s: %v", n+1, addr, ns.Name, err)
		}
		if !slices.Contains(want, a.Pod) {
			t.Fatalf("connection %d to %s from %s answered by %s, want one of %v", n+1, addr, ns.Name, a, want)
		}
	}
	return n
}

// programmingHistogram is the sum and count of Weir's
// kubeproxy_network_programming_duration_seconds.
type programmingHistogram struct {
	sum   float64
	count int
}

// The histogram's sum and count, of its IPv4 series (the tests' slices
// are IPv4) when it is labelled by ip_family as kube-proxy's is, or of its
// one series when it is not.
var (
	programmingSum   = regexp.MustCompile(`(?m)^kubeproxy_network_programming_duration_seconds_sum(?:\{ip_family="IPv4"\})? (\S+)$`)
	programmingCount = regexp.MustCompile(`(?m)^kubeproxy_network_programming_duration_seconds_count(?:\{ip_family="IPv4"\})? (\S+)$`)
)

// scrapeProgramming reads the network programming histogram from Weir's
// /metrics at addr, through an HTTP client in Weir's namespace.
func scrapeProgramming(t *testing.T, c *http.Client, addr string) programmingHistogram {
	t.Helper()
	code, body, err := get(c, "http://"+addr+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %v", addr, code, err)
	}
	var h programmingHistogram
	if m := programmingSum.FindStringSubmatch(body); m != nil {
		h.sum, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := programmingCount.FindStringSubmatch(body); m != nil {
		h.count, _ = strconv.Atoi(m[1])
	}
	return h
}

// since describes the observations added to the histogram after prev.
func (h programmingHistogram) since(prev programmingHistogram) string {
	n := h.count - prev.count
	if n <= 0 {
		return "no new observation"
	}
	mean := time.Duration((h.sum - prev.sum) / float64(n) * float64(time.Second))
	return fmt.Sprintf("%d new observation(s), mean %v", n, mean.Round(time.Millisecond))
}

// createNode creates the Node name, as a kubelet registering would.
func createNode(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name string, ip netip.Addr) {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}},
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

// createSvc creates svc and returns it as the API server stored it, with
// its cluster IP and node ports allocated.
func createSvc(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, svc *corev1.Service) *corev1.Service {
	t.Helper()
	out, err := cp.Client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	return out
}

// clusterIP is the service's IPv4 cluster IP and its first port.
func clusterIP(t *testing.T, svc *corev1.Service) netip.AddrPort {
	t.Helper()
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("service %s cluster IP %q: %v", svc.Name, svc.Spec.ClusterIP, err)
	}
	return netip.AddrPortFrom(ip, uint16(svc.Spec.Ports[0].Port))
}

// sliceWatch reports when the EndpointSlice controller first wrote a slice
// of a Service that satisfies a condition, as seen through a watch.
type sliceWatch struct {
	at   chan time.Time // receives the time once, then is closed
	stop context.CancelFunc
}

// watchSlice watches the slices of Service default/service; the watch is
// established when it returns, so changes made afterwards are seen.
func watchSlice(t *testing.T, cp *controlplane.ControlPlane, service string, cond func(*discoveryv1.EndpointSlice) bool) *sliceWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w, err := cp.Client.DiscoveryV1().EndpointSlices("default").Watch(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		cancel()
		t.Fatalf("watch the slices of %s: %v", service, err)
	}
	sw := &sliceWatch{at: make(chan time.Time, 1), stop: cancel}
	go func() {
		defer close(sw.at)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*discoveryv1.EndpointSlice); ok && cond(s) {
				sw.at <- time.Now()
				return
			}
		}
	}()
	t.Cleanup(cancel)
	return sw
}

// wait returns when the condition first held, or the zero time if it had
// not within limit.
func (sw *sliceWatch) wait(limit time.Duration) time.Time {
	defer sw.stop()
	select {
	case at := <-sw.at:
		return at
	case <-time.After(limit):
		return time.Time{}
	}
}

// endpointReady reports whether s lists ip with the given readiness.
func endpointReady(s *discoveryv1.EndpointSlice, ip string, ready bool) bool {
	for _, e := range s.Endpoints {
		if slices.Contains(e.Addresses, ip) {
			return (e.Conditions.Ready != nil && *e.Conditions.Ready) == ready
		}
	}
	return false
}

// breakdown splits a programming latency measured from change to the
// first probe at served into the controller's part (until the slice was
// written) and the rest (Weir and the kernel).
func breakdown(change, written, served time.Time) string {
	if written.IsZero() {
		return fmt.Sprintf("%v in all (the slice change was not seen)", served.Sub(change).Round(time.Millisecond))
	}
	return fmt.Sprintf("%v in all: EndpointSlice controller %v, then Weir to the datapath %v",
		served.Sub(change).Round(time.Millisecond), written.Sub(change).Round(time.Millisecond),
		served.Sub(written).Round(time.Millisecond))
}
