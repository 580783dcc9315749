package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePort reserves a loopback port by opening and closing a listener.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// countingListen counts listen calls and records their addresses.
type countingListen struct {
	mu    sync.Mutex
	calls []string
}

func (c *countingListen) listen(network, address string) (net.Listener, error) {
	c.mu.Lock()
	c.calls = append(c.calls, network+" "+address)
	c.mu.Unlock()
	return net.Listen(network, address)
}

func (c *countingListen) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

func newTestServers(t *testing.T, opts Options) *Servers {
	t.Helper()
	if opts.Addresses == nil {
		opts.Addresses = loopback
	}
	s := NewServers(opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type response struct {
	code   int
	header http.Header
	body   string
}

func probe(t *testing.T, client *http.Client, port uint16, path string) response {
	t.Helper()
	r, err := get(client, port, path)
	if err != nil {
		t.Fatalf("probe port %d: %v", port, err)
	}
	return r
}

// get is probe for goroutines other than the test's own.
func get(client *http.Client, port uint16, path string) (response, error) {
	if client == nil {
		client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{resp.StatusCode, resp.Header, string(b)}, nil
}

func wantRefused(t *testing.T, port uint16) {
	t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err == nil {
		c.Close()
		t.Fatalf("port %d still accepts connections", port)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("port %d: want connection refused, got %v", port, err)
	}
}

// kubeProxyBody is what kube-proxy's service health server writes.
func kubeProxyBody(ns, name string, n int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", ns, name, n, healthy)
}

type payload struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func checkResponse(t *testing.T, r response, code int, ns, name string, n int, healthy bool) {
	t.Helper()
	if r.code != code {
		t.Errorf("status %d, want %d", r.code, code)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	if got := r.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q", got)
	}
	if got, want := r.header.Get("X-Load-Balancing-Endpoint-Weight"), strconv.Itoa(n); got != want {
		t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %q", got, want)
	}
	if want := kubeProxyBody(ns, name, n, healthy); r.body != want {
		t.Errorf("body\n%s\nwant\n%s", r.body, want)
	}
	var p payload
	dec := json.NewDecoder(strings.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("body is not the expected JSON: %v", err)
	}
	if p.Service.Namespace != ns || p.Service.Name != name || p.LocalEndpoints != n || p.ServiceProxyHealthy != healthy {
		t.Errorf("decoded %+v", p)
	}
}

func TestLocalEndpointsAnswer200(t *testing.T) {
	s := newTestServers(t, Options{})
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/healthz", "/any/path?x=1"} {
		checkResponse(t, probe(t, nil, port, path), http.StatusOK, "ns", "web", 2, true)
	}
}

func TestNoLocalEndpointsAnswer503(t *testing.T) {
	s := newTestServers(t, Options{})
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port}}); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, port, "/"), http.StatusServiceUnavailable, "ns", "web", 0, true)
}

func TestUnhealthyProxyAnswers503(t *testing.T) {
	var healthy atomic.Bool
	s := newTestServers(t, Options{Healthy: healthy.Load})
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 3}}); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, port, "/"), http.StatusServiceUnavailable, "ns", "web", 3, false)
	healthy.Store(true)
	checkResponse(t, probe(t, nil, port, "/"), http.StatusOK, "ns", "web", 3, true)
}

func TestCountUpdateKeepsListenerAndConnections(t *testing.T) {
	var lc countingListen
	s := newTestServers(t, Options{ListenConfig: lc.listen})
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	before := s.ports[port]
	s.mu.Unlock()

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	checkResponse(t, probe(t, client, port, "/"), http.StatusOK, "ns", "web", 1, true)

	for _, n := range []int{0, 5} {
		if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: n}}); err != nil {
			t.Fatal(err)
		}
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !reused {
			t.Errorf("count %d: the kept-alive connection was not reused", n)
		}
		code := http.StatusOK
		if n == 0 {
			code = http.StatusServiceUnavailable
		}
		checkResponse(t, response{resp.StatusCode, resp.Header, string(b)}, code, "ns", "web", n, true)
	}
	if got := lc.count(); got != 1 {
		t.Errorf("listen called %d times, want 1: %v", got, lc.calls)
	}
	s.mu.Lock()
	after := s.ports[port]
	s.mu.Unlock()
	if before != after {
		t.Error("the port's server was replaced")
	}
}

func TestRemovedServiceClosesPort(t *testing.T) {
	s := newTestServers(t, Options{})
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync([]Service{
		{Namespace: "ns", Name: "a", Port: p1, LocalEndpoints: 1},
		{Namespace: "ns", Name: "b", Port: p2, LocalEndpoints: 1},
	}); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, p1, "/"), http.StatusOK, "ns", "a", 1, true)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "b", Port: p2, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, p1)
	checkResponse(t, probe(t, nil, p2, "/"), http.StatusOK, "ns", "b", 1, true)

	// The freed port can be taken by anyone, including a new service.
	if err := s.Sync([]Service{{Namespace: "ns", Name: "c", Port: p1}}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, p2)
	checkResponse(t, probe(t, nil, p1, "/"), http.StatusServiceUnavailable, "ns", "c", 0, true)
}

func TestPortConflictFirstByNameWins(t *testing.T) {
	var lc countingListen
	s := newTestServers(t, Options{ListenConfig: lc.listen})
	shared, other := freePort(t), freePort(t)
	services := []Service{
		{Namespace: "zeta", Name: "late", Port: shared, LocalEndpoints: 0},
		{Namespace: "alpha", Name: "early", Port: shared, LocalEndpoints: 4},
		{Namespace: "ns", Name: "other", Port: other, LocalEndpoints: 1},
	}
	err := s.Sync(services)
	if err == nil {
		t.Fatal("want a conflict error")
	}
	for _, want := range []string{"zeta/late", "alpha/early", fmt.Sprint(shared)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	checkResponse(t, probe(t, nil, shared, "/"), http.StatusOK, "alpha", "early", 4, true)
	checkResponse(t, probe(t, nil, other, "/"), http.StatusOK, "ns", "other", 1, true)

	// The winner goes away: the other claimant takes the port in place.
	if err := s.Sync([]Service{services[0], services[2]}); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, shared, "/"), http.StatusServiceUnavailable, "zeta", "late", 0, true)
	if got := lc.count(); got != 2 {
		t.Errorf("listen called %d times, want 2: %v", got, lc.calls)
	}
}

func TestSameServiceListedTwiceIsNoConflict(t *testing.T) {
	s := newTestServers(t, Options{})
	port := freePort(t)
	// One entry per service port, as a planner emits them.
	if err := s.Sync([]Service{
		{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 1},
		{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 2},
		{Namespace: "ns", Name: "nohc", Port: 0, LocalEndpoints: 2},
	}); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, port, "/"), http.StatusOK, "ns", "web", 2, true)
}

func TestPortInUseIsRetried(t *testing.T) {
	s := newTestServers(t, Options{})
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := uint16(held.Addr().(*net.TCPAddr).Port)
	free := freePort(t)
	services := []Service{
		{Namespace: "ns", Name: "busy", Port: busy, LocalEndpoints: 1},
		{Namespace: "ns", Name: "free", Port: free, LocalEndpoints: 1},
	}

	err = s.Sync(services)
	if err == nil {
		t.Fatal("want an error for the port in use")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error %v does not wrap EADDRINUSE", err)
	}
	for _, want := range []string{"ns/busy", fmt.Sprint(busy)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "ns/free") {
		t.Errorf("error %q names the service that bound", err)
	}
	checkResponse(t, probe(t, nil, free, "/"), http.StatusOK, "ns", "free", 1, true)

	// Still held: the next Sync retries and fails again.
	if err := s.Sync(services); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second sync: %v", err)
	}
	held.Close()
	if err := s.Sync(services); err != nil {
		t.Fatalf("sync after release: %v", err)
	}
	checkResponse(t, probe(t, nil, busy, "/"), http.StatusOK, "ns", "busy", 1, true)
	checkResponse(t, probe(t, nil, free, "/"), http.StatusOK, "ns", "free", 1, true)
}

func TestPartialBindIsUndone(t *testing.T) {
	// Two addresses; the second is held, so the first must be released too.
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	held, err := net.Listen("tcp4", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("127.0.0.2 (all of 127.0.0.0/8 is loopback on Linux): %v", err)
	}
	defer held.Close()
	port := uint16(held.Addr().(*net.TCPAddr).Port)
	s := newTestServers(t, Options{Addresses: addrs})
	svc := []Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 1}}
	if err := s.Sync(svc); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("want EADDRINUSE, got %v", err)
	}
	wantRefused(t, port)
	held.Close()
	if err := s.Sync(svc); err != nil {
		t.Fatal(err)
	}
	checkResponse(t, probe(t, nil, port, "/"), http.StatusOK, "ns", "web", 1, true)
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.2:%d", port))
	if err != nil {
		t.Fatalf("second address: %v", err)
	}
	c.Close()
}

func TestBindAddresses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs []netip.Addr
		want  []string
	}{
		{"all", nil, []string{"tcp :P"}},
		{"v4 and v6, duplicates dropped", []netip.Addr{
			netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("fd00::1"),
		}, []string{"tcp4 10.0.0.1:P", "tcp6 [fd00::1]:P"}},
		{"both wildcards", []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()},
			[]string{"tcp4 0.0.0.0:P", "tcp6 [::]:P"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, b := range binds(tc.addrs) {
				got = append(got, b.network+" "+net.JoinHostPort(b.host, "P"))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("binds %v, want %v", got, tc.want)
			}
		})
	}
}

func TestInvalidAddressFailsEverySync(t *testing.T) {
	s := newTestServers(t, Options{Addresses: []netip.Addr{{}}})
	err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: freePort(t)}})
	if err == nil || !strings.Contains(err.Error(), "invalid") || !strings.Contains(err.Error(), "ns/web") {
		t.Fatalf("want an invalid-address error naming the service, got %v", err)
	}
}

func TestDefaultListensOnAllAddresses(t *testing.T) {
	var lc countingListen
	s := NewServers(Options{ListenConfig: lc.listen})
	defer s.Close()
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("[tcp :%d]", port); fmt.Sprint(lc.calls) != want {
		t.Errorf("listen calls %v, want %v", lc.calls, want)
	}
	checkResponse(t, probe(t, nil, port, "/"), http.StatusOK, "ns", "web", 1, true)
}

func TestCloseClosesAll(t *testing.T) {
	s := NewServers(Options{Addresses: loopback})
	p1, p2 := freePort(t), freePort(t)
	if err := s.Sync([]Service{
		{Namespace: "ns", Name: "a", Port: p1, LocalEndpoints: 1},
		{Namespace: "ns", Name: "b", Port: p2},
	}); err != nil {
		t.Fatal(err)
	}
	// A kept-alive connection must be closed too.
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	probe(t, client, p1, "/")

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, p1)
	wantRefused(t, p2)
	if _, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", p1)); err == nil {
		t.Error("request after Close succeeded")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Sync(nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Sync after Close: %v", err)
	}
}

func TestConcurrentProbesDuringSync(t *testing.T) {
	s := newTestServers(t, Options{Healthy: func() bool { return true }})
	port := freePort(t)
	if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			for range 50 {
				r, err := get(client, port, "/")
				if err != nil {
					t.Error(err)
					return
				}
				var p payload
				if err := json.Unmarshal([]byte(r.body), &p); err != nil {
					t.Error(err)
					return
				}
				if (r.code == http.StatusOK) != (p.LocalEndpoints > 0) {
					t.Errorf("status %d with %d endpoints", r.code, p.LocalEndpoints)
				}
			}
		})
	}
	for i := range 200 {
		if err := s.Sync([]Service{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: i % 3}}); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}

func TestDesiredIsDeterministic(t *testing.T) {
	svcs := []Service{
		{Namespace: "c", Name: "x", Port: 1},
		{Namespace: "b", Name: "x", Port: 1},
		{Namespace: "a", Name: "y", Port: 2},
		{Namespace: "a", Name: "x", Port: 1},
		{Namespace: "c", Name: "x", Port: 1},
		{Namespace: "a", Name: "z", Port: 2},
	}
	want, errs := desired(svcs)
	if w := want[1]; w.Namespace != "a" || w.Name != "x" {
		t.Errorf("port 1 owner %v", w)
	}
	if w := want[2]; w.Namespace != "a" || w.Name != "y" {
		t.Errorf("port 2 owner %v", w)
	}
	got := joinByPort(errs).Error()
	wantErr := "service b/x: health check node port 1 is also claimed by service a/x, which keeps it\n" +
		"service c/x: health check node port 1 is also claimed by service a/x, which keeps it\n" +
		"service a/z: health check node port 2 is also claimed by service a/y, which keeps it"
	if got != wantErr {
		t.Errorf("errors\n%s\nwant\n%s", got, wantErr)
	}
}
