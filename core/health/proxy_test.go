package health

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// fakeNow is a clock the test moves by hand.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time          { return f.t }
func (f *fakeNow) advance(d time.Duration) { f.t = f.t.Add(d) }

func newTestProxy(timeout time.Duration) (*Proxy, *fakeNow) {
	clock := &fakeNow{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	return NewProxy(ProxyOptions{Timeout: timeout, Now: clock.now}), clock
}

func TestProxyHealthDecision(t *testing.T) {
	const timeout = 60 * time.Second
	h, clock := newTestProxy(timeout)
	want := func(step string, healthy, eligible bool) {
		t.Helper()
		st := h.Status()
		if st.Healthy != healthy || st.NodeEligible != eligible || h.Healthy() != healthy {
			t.Errorf("%s: healthy %v, node eligible %v; want %v, %v", step, st.Healthy, st.NodeEligible, healthy, eligible)
		}
	}
	want("at start", true, true)
	clock.advance(time.Hour)
	want("an hour later with nothing queued", true, true)

	h.Queued()
	clock.advance(timeout - time.Nanosecond)
	want("a change queued just under the timeout ago", true, true)
	h.Queued() // a later change does not move the oldest one
	clock.advance(time.Nanosecond)
	want("a change queued the timeout ago", false, true)

	h.Updated()
	want("after a successful sync", true, true)
	if got := h.Status().LastUpdated; !got.Equal(clock.t) {
		t.Errorf("LastUpdated %v, want %v", got, clock.t)
	}
	clock.advance(10 * timeout)
	want("long after the sync with nothing queued", true, true)

	h.Queued()
	clock.advance(timeout / 2)
	h.Updated()
	h.Queued()
	clock.advance(timeout / 2)
	want("the oldest change is younger than the timeout", true, true)

	h.SetNodeEligible(false)
	want("node being deleted", true, false)
	clock.advance(timeout)
	want("node being deleted and a change late", false, false)
	h.SetNodeEligible(true)
	h.Updated()
	want("recovered", true, true)
}

// probeProxy answers one request and decodes its JSON body.
func probeProxy(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	res := rec.Result()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusNotFound {
		return res.StatusCode, nil
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", path, ct)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", path, body, err)
	}
	return res.StatusCode, m
}

func TestProxyHandlers(t *testing.T) {
	const timeout = time.Minute
	clock := &fakeNow{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	var observed []string
	h := NewProxy(ProxyOptions{Timeout: timeout, Now: clock.now, Observe: func(path string, code int) {
		observed = append(observed, path+" "+http.StatusText(code))
	}})
	handler := h.Handler()
	now := clock.t.String()

	code, body := probeProxy(t, handler, "/healthz")
	if code != http.StatusOK || body["currentTime"] != now || body["lastUpdated"] != now || body["nodeEligible"] != true {
		t.Errorf("healthy /healthz: %d %v; want 200, both times %q, nodeEligible true", code, body, now)
	}
	code, body = probeProxy(t, handler, "/livez")
	if _, has := body["nodeEligible"]; code != http.StatusOK || has {
		t.Errorf("healthy /livez: %d %v; want 200 without nodeEligible", code, body)
	}

	h.Updated()
	synced := clock.t.String()
	h.Queued()
	clock.advance(timeout)
	now = clock.t.String()
	for _, path := range []string{"/healthz", "/livez"} {
		code, body = probeProxy(t, handler, path)
		if code != http.StatusServiceUnavailable || body["lastUpdated"] != synced || body["currentTime"] != now {
			t.Errorf("late %s: %d %v; want 503, lastUpdated %q, currentTime %q", path, code, body, synced, now)
		}
	}

	h.Updated()
	h.SetNodeEligible(false)
	code, body = probeProxy(t, handler, "/healthz")
	if code != http.StatusServiceUnavailable || body["nodeEligible"] != false {
		t.Errorf("/healthz of a Node being deleted: %d %v; want 503, nodeEligible false", code, body)
	}
	if code, _ = probeProxy(t, handler, "/livez"); code != http.StatusOK {
		t.Errorf("/livez of a Node being deleted: %d, want 200", code)
	}
	if code, _ = probeProxy(t, handler, "/other"); code != http.StatusNotFound {
		t.Errorf("/other: %d, want 404", code)
	}
	want := []string{"/healthz OK", "/livez OK", "/healthz Service Unavailable", "/livez Service Unavailable",
		"/healthz Service Unavailable", "/livez OK"}
	if len(observed) != len(want) {
		t.Fatalf("observed %q, want %q", observed, want)
	}
	for i := range want {
		if observed[i] != want[i] {
			t.Errorf("observed[%d] = %q, want %q", i, observed[i], want[i])
		}
	}
}

// TestProxyBodyLayout pins the body text kube-proxy's probes and scripts parse.
func TestProxyBodyLayout(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got := string(renderStatus(time.Time{}, at, true, true))
	want := `{"lastUpdated": "0001-01-01 00:00:00 +0000 UTC","currentTime": "2026-01-02 03:04:05 +0000 UTC", "nodeEligible": true}`
	if got != want {
		t.Errorf("/healthz body\n got %s\nwant %s", got, want)
	}
	got = string(renderStatus(at, at, false, false))
	want = `{"lastUpdated": "2026-01-02 03:04:05 +0000 UTC","currentTime": "2026-01-02 03:04:05 +0000 UTC"}`
	if got != want {
		t.Errorf("/livez body\n got %s\nwant %s", got, want)
	}
}
