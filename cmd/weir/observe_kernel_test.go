package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/netns"
)

// TestKernelHealthAndMetrics runs weir run in mode nftables in a node
// namespace with its health and metrics servers on free loopback ports,
// scrapes /healthz, /livez, /metrics and /proxyMode, follows an
// EndpointSlice change into the network programming metric, and marks the
// Node as being deleted.
func TestKernelHealthAndMetrics(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	dir := copyDemo(t)
	topo := netns.NewThreePods(t)
	d := startDaemon(t, topo.Node, weir, "run", "--min-sync-period", "0s", "--source-path", dir, "--node-name", demoNode,
		"--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0")
	healthAddr := waitServing(t, d, "healthzBindAddress")
	metricsAddr := waitServing(t, d, "metricsBindAddress")
	c := topo.Node.HTTPClient(5 * time.Second)
	waitAnswer(t, d, topo.Client, webVIP)

	if code, body := httpGet(t, c, "http://"+healthAddr+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"nodeEligible": true`) {
		t.Errorf("/healthz: %d %s; want 200 with nodeEligible true", code, body)
	}
	if code, body := httpGet(t, c, "http://"+healthAddr+"/livez"); code != http.StatusOK || !strings.Contains(body, `"lastUpdated"`) {
		t.Errorf("/livez: %d %s; want 200 with lastUpdated", code, body)
	}
	if code, body := httpGet(t, c, "http://"+metricsAddr+"/proxyMode"); code != http.StatusOK || body != "nftables" {
		t.Errorf("/proxyMode: %d %q; want 200 nftables", code, body)
	}
	if code, body := httpGet(t, c, "http://"+metricsAddr+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("metrics server /healthz: %d %q; want 200 ok", code, body)
	}
	// Traffic flows once the rules are committed; the sync is recorded just
	// after (conntrack cleanup and the health-check servers come between).
	text := waitMetric(t, d, c, metricsAddr, `(?m)^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="IPv4"\} [1-9]`)
	for _, re := range []string{
		`(?m)^kubeproxy_sync_full_proxy_rules_duration_seconds_count\{ip_family="IPv4"\} [1-9]`,
		`(?m)^kubeproxy_sync_proxy_rules_duration_seconds_bucket\{ip_family="IPv4",le="16.384"\} [1-9]`,
		`(?m)^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="IPv4"\} [1-9]`,
		`(?m)^kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds\{ip_family="IPv4"\} [1-9]`,
		`(?m)^kubeproxy_sync_proxy_rules_service_changes_total [1-9]`,
		`(?m)^kubeproxy_sync_proxy_rules_endpoint_changes_pending 0$`,
		`(?m)^kubeproxy_proxy_healthz_total\{code="200"\} 1$`,
		`(?m)^weir_backend_commit_failures_total\{mode="nftables"\} 0$`,
		`(?m)^process_start_time_seconds `,
		`(?m)^go_goroutines `,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("/metrics does not match %s", re)
		}
	}

	// An EndpointSlice change stamped by the control plane is observed
	// once its rules are committed.
	rewriteSlice(t, filepath.Join(dir, "web.yaml"), "pod-b", time.Now())
	waitWithout(t, d, topo.Client, webVIP, "pod-b", 20)
	waitMetric(t, d, c, metricsAddr, `(?m)^kubeproxy_network_programming_duration_seconds_count\{ip_family="IPv4"\} 1$`)

	// A Node being deleted fails /healthz, not /livez.
	markNodeDeleting(t, filepath.Join(dir, "node.yaml"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mustRun(t)
		code, body := httpGet(t, c, "http://"+healthAddr+"/healthz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, `"nodeEligible": false`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz of a Node being deleted: %d %s after 10s; want 503 with nodeEligible false", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := httpGet(t, c, "http://"+healthAddr+"/livez"); code != http.StatusOK {
		t.Errorf("/livez of a Node being deleted: %d %s; want 200", code, body)
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if err := d.wait(10 * time.Second); err != nil {
		t.Fatalf("weir run after SIGTERM: %v, want exit 0\n%s", err, d.out)
	}
	if _, err := c.Get("http://" + healthAddr + "/livez"); err == nil {
		t.Errorf("the health server still answers after weir run stopped")
	}
}

// servingLine is the log line of a server that listens.
var servingLine = regexp.MustCompile(`msg=Serving key=(\S+) address=(\S+)`)

// waitServing returns the address the daemon's server for key listens on.
func waitServing(t *testing.T, d *daemon, key string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		d.mustRun(t)
		for _, m := range servingLine.FindAllStringSubmatch(d.out.String(), -1) {
			if m[1] == key {
				return m[2]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("weir run did not log its %s server within 10s:\n%s", key, d.out)
	return ""
}

func httpGet(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	res, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, string(body)
}

// waitMetric polls /metrics until it matches re, and returns that scrape.
func waitMetric(t *testing.T, d *daemon, c *http.Client, addr, re string) string {
	t.Helper()
	want := regexp.MustCompile(re)
	deadline := time.Now().Add(10 * time.Second)
	var text string
	for time.Now().Before(deadline) {
		d.mustRun(t)
		if _, text = httpGet(t, c, "http://"+addr+"/metrics"); want.MatchString(text) {
			return text
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/metrics did not match %s within 10s:\n%s", re, text)
	return ""
}

// rewriteSlice drops pod's endpoints from the EndpointSlices in path and
// stamps them with the last-change-trigger-time at.
func rewriteSlice(t *testing.T, path, pod string, at time.Time) {
	t.Helper()
	editDocs(t, path, "kind: EndpointSlice", func(doc []byte) []byte {
		var s discoveryv1.EndpointSlice
		if err := yaml.UnmarshalStrict(doc, &s); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		s.Endpoints = slices.DeleteFunc(s.Endpoints, func(e discoveryv1.Endpoint) bool {
			return e.TargetRef != nil && e.TargetRef.Name == pod
		})
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[corev1.EndpointsLastChangeTriggerTime] = at.UTC().Format(time.RFC3339Nano)
		return mustYAML(t, &s)
	})
}

// markNodeDeleting sets the deletionTimestamp of the Node in path.
func markNodeDeleting(t *testing.T, path string) {
	t.Helper()
	editDocs(t, path, "kind: Node", func(doc []byte) []byte {
		var n corev1.Node
		if err := yaml.UnmarshalStrict(doc, &n); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		return mustYAML(t, &n)
	})
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	out, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editDocs rewrites the documents of path that contain marker with edit,
// through a temporary file and a rename.
func editDocs(t *testing.T, path, marker string, edit func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	found := false
	for i, doc := range docs {
		if strings.Contains(doc, marker) {
			docs[i], found = string(edit([]byte(doc))), true
		}
	}
	if !found {
		t.Fatalf("%s: no document with %q", path, marker)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
