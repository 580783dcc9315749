package kubernetes

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// A refused connection is logged with its attempt and next delay, reported
// as the source being down and named in Run's error; Run stops at once.
func TestRunReportsRefusedConnection(t *testing.T) {
	addr := closedPort(t)
	r := start(t, config("https://"+addr, defaultLimits))
	r.waitLogs(`msg="Cannot reach the API server; retrying, rules unchanged"`, "attempt=1", "retryIn=",
		"connect: connection refused", "objects=Services", `objects=EndpointSlices`, `objects="Node n1"`)
	r.waitLogs(`msg="Still waiting for the API server's objects"`, "waitingFor=", "failed")
	r.waitCall("Down: cannot ")
	calls := strings.Join(r.rec.snapshot(), "\n")
	if !strings.Contains(calls, "connection refused") || !strings.Contains(calls, addr) {
		t.Errorf("OnSourceDown does not say why:\n%s", calls)
	}
	err := r.stop()
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "waiting for Services") {
		t.Errorf("Run after cancel: %v; want what it waited for and why", err)
	}
}

// The retry backoff doubles each attempt, and a long run of failures logs
// a handful of lines, not one per attempt.
func TestRunLogsFewLinesPerOutage(t *testing.T) {
	r := start(t, config("https://"+closedPort(t), defaultLimits))
	r.waitLogs("objects=Services request=list attempt=16 ")
	lines := strings.Count(r.logs.String(), "objects=Services request=list ")
	_ = r.stop() // TestRunReportsRefusedConnection checks Run's error after a cancel
	// attempts 1, 2, 3, 4, 8 and 16, and perhaps 32 by now.
	if lines < 6 || lines > 7 {
		t.Errorf("%d lines for 16 failed lists of Services, want 6 or 7:\n%s", lines, r.logs.String())
	}
}

// A server that accepts connections and never answers: the requests give
// up with a reason, the wait says what is unanswered, and Run stops at once.
func TestRunReportsUnansweredRequests(t *testing.T) {
	addr := silentListener(t)
	r := start(t, config("http://"+addr, limits{connect: time.Second, answer: 300 * time.Millisecond}))
	r.waitLogs(`msg="Still waiting for the API server's objects"`, "request unanswered for")
	r.waitLogs("no answer from the API server within 300ms", "attempt=1")
	if err := r.stop(); err == nil || !strings.Contains(err.Error(), "no answer from the API server") {
		t.Errorf("Run after cancel: %v", err)
	}
}

// Connections closed as soon as they open are seen at the first attempt:
// client-go's own retries, which would repeat such a request ten times
// without a word, are off.
func TestRunReportsClosedConnectionsAtOnce(t *testing.T) {
	r := start(t, config("https://"+closingListener(t), defaultLimits))
	r.waitLogsWithin(3*time.Second, "objects=Services request=list attempt=2 ")
	_ = r.stop() // TestRunReportsRefusedConnection checks Run's error after a cancel
}

// An API server that refuses Weir's credentials says so, and is retried.
func TestRunReportsUnauthorized(t *testing.T) {
	f := newFakeAPI(t, http.StatusUnauthorized)
	r := start(t, config(f.srv.URL, defaultLimits))
	r.waitLogs("error=Unauthorized", "attempt=2")
	r.waitCall("Down: cannot list ")
	if calls := strings.Join(r.rec.snapshot(), "\n"); !strings.Contains(calls, "from the API server at "+f.srv.URL+": Unauthorized") {
		t.Errorf("OnSourceDown does not say why:\n%s", calls)
	}
	_ = r.stop() // TestRunReportsRefusedConnection checks Run's error after a cancel
}

// An API server that answers 503 at first: the source is down, then it
// delivers the objects, says it reached the server again and is up.
func TestRunRecovers(t *testing.T) {
	f := newFakeAPI(t, http.StatusServiceUnavailable)
	r := start(t, config(f.srv.URL, defaultLimits))
	r.waitCall("Down: ")
	f.fail.Store(0)
	r.waitCall("Up")
	calls := r.rec.snapshot()
	synced, up := -1, -1
	for i, c := range calls {
		switch c {
		case "Synced":
			synced = i
		case "Up":
			up = i
		}
	}
	if synced < 0 || synced > up || !strings.Contains(strings.Join(calls, "\n"), "add Service default/web") {
		t.Errorf("calls %q: want the Service, then Synced, then Up", calls)
	}
	r.waitLogs(`msg="Reached the API server again"`, "failedAttempts=")
	if err := r.stop(); err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}

// A client configuration from a kubeconfig gets the connection limits: a
// refused API server fails at once, with the reason.
func TestConfigLimitsConnections(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	addr := closedPort(t)
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+addr+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(kc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dial == nil || cfg.WrapTransport == nil {
		t.Fatalf("Config(%s) has no connection limits", kc)
	}
	r := start(t, cfg)
	r.waitLogs("connect: connection refused")
	_ = r.stop() // TestRunReportsRefusedConnection checks Run's error after a cancel
}

// A request whose answer does not come in time fails with the reason; a
// watch that resumes is left alone; a quick answer passes.
func TestAnswerWithin(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") == "true" {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	defer close(release)
	client := &http.Client{Transport: &answerWithin{next: http.DefaultTransport, timeout: 100 * time.Millisecond}}
	get := func(query string) error {
		resp, err := client.Get(srv.URL + "/api/v1/services?" + query)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get("slow=true"); err == nil || !strings.Contains(err.Error(), "no answer from the API server within 100ms") {
		t.Errorf("slow list: %v, want the timeout named", err)
	}
	if err := get("slow=true&watch=true&sendInitialEvents=true"); err == nil {
		t.Error("slow streaming list: no error, want the timeout")
	}
	go func() {
		time.Sleep(300 * time.Millisecond) // longer than the timeout
		release <- struct{}{}
	}()
	if err := get("slow=true&watch=true&resourceVersion=5"); err != nil {
		t.Errorf("resumed watch answered after 300ms: %v, want it left alone", err)
	}
	if err := get(""); err != nil {
		t.Errorf("quick list: %v", err)
	}
}

// The backoff doubles from its initial delay up to its cap, each wait
// between the delay and twice it, and starts over after a reset.
func TestBackoff(t *testing.T) {
	b := backoff{initial: 100 * time.Millisecond, max: 400 * time.Millisecond}
	for i, base := range []time.Duration{100, 200, 400, 400} {
		base *= time.Millisecond
		if d := b.next(); d < base || d > 2*base {
			t.Errorf("wait %d: %v, want between %v and %v", i+1, d, base, 2*base)
		}
	}
	b.reset()
	if d := b.next(); d > 200*time.Millisecond {
		t.Errorf("after reset: %v", d)
	}
}

// A stop while a request waits out its backoff ends the wait at once.
func TestAttemptStopsDuringBackoff(t *testing.T) {
	st := newStatus(discard(), "https://example", &recorder{})
	w := st.add("Services", backoff{initial: time.Hour, max: time.Hour})
	r := &retrying{obj: w, wait: sleep}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan error, 1)
	go func() {
		_, err := attempt(ctx, r, "list", func(context.Context) (int, error) {
			calls++
			return 0, context.DeadlineExceeded // not an API status: unreachable
		})
		done <- err
	}()
	poll(t, "a failed attempt", func() bool { return strings.Contains(st.waitingFor(), "failed 1 times") }, st.waitingFor)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("attempt returned %v, want context.Canceled (which the reflector takes for a stop)", err)
		}
	case <-time.After(time.Second):
		t.Fatal("attempt still waiting a second after cancel")
	}
}

// An API server that goes away after the initial objects were delivered
// is logged, and its return, but the source is not reported down: the
// caches and the rules stay, and all nodes failing their health checks at
// once would take the cluster's load balancers down.
func TestOutageAfterSyncIsLoggedNotReported(t *testing.T) {
	f := newFakeAPI(t, 0)
	r := start(t, config(f.srv.URL, defaultLimits))
	r.waitCall("Synced")
	f.fail.Store(http.StatusServiceUnavailable)
	f.dropWatches()
	r.waitLogs(`msg="Cannot reach the API server; retrying, rules unchanged"`, `error="Service Unavailable"`)
	f.fail.Store(0)
	r.waitLogs(`msg="Reached the API server again"`)
	_ = r.stop() // TestRunReportsRefusedConnection checks Run's error after a cancel
	for _, c := range r.rec.snapshot() {
		if strings.HasPrefix(c, "Down") || c == "Up" {
			t.Errorf("handler got %q after the initial sync", c)
		}
	}
}

// client-go's Watch makes an empty watch, and no error, of a connection
// that closes or times out; the source still sees the failure and retries.
func TestWatchFailureNotMasked(t *testing.T) {
	cfg := config("https://"+closingListener(t), defaultLimits)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := newStatus(discard(), cfg.Host, &recorder{})
	w := st.add("Services", backoff{initial: 10 * time.Millisecond, max: 10 * time.Millisecond})
	r := &retrying{inner: listWatch(client.CoreV1().RESTClient(), "services",
		func() runtime.Object { return &corev1.ServiceList{} }, func(*metav1.ListOptions) {}), obj: w, wait: sleep}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	watcher, err := r.WatchWithContext(ctx, metav1.ListOptions{SendInitialEvents: ptr(true)})
	if err == nil {
		watcher.Stop()
		t.Fatal("the watch of a server that closes every connection succeeded")
	}
	if got := st.waitingFor(); !strings.Contains(got, "EOF") && !strings.Contains(got, "reset") {
		t.Errorf("status %q does not name the broken connection", got)
	}
}

func ptr[T any](v T) *T { return &v }
