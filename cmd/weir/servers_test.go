package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRunBindError starts weir run with an address already in use: it
// fails at once, before touching the kernel, naming the key and address.
func TestRunBindError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()
	for _, key := range []string{"healthz", "metrics"} {
		t.Run(key, func(t *testing.T) {
			args := []string{"run", "--source-path", "testdata/manifests", "--node-name", "n1",
				"--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"}
			args = append(args, "--"+key+"-bind-address", busy)
			code, _, stderr := invoke(t, args...)
			if code != exitFailed {
				t.Errorf("exit %d, want %d\n%s", code, exitFailed, stderr)
			}
			if want := key + "BindAddress " + busy; !strings.Contains(stderr, want) || !strings.Contains(stderr, "address already in use") {
				t.Errorf("stderr does not name %q and the cause:\n%s", want, stderr)
			}
		})
	}
}

// TestWithProfiling checks that enableProfiling's handler serves the heap
// profile and still passes every other path to the metrics handler.
func TestWithProfiling(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) })
	srv := httptest.NewServer(withProfiling(metrics))
	defer srv.Close()
	for path, want := range map[string]string{"/metrics": "metrics", "/debug/pprof/heap?debug=1": "heap profile:"} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), want) {
			t.Errorf("GET %s: %s, %.40q; want 200 and %q", path, res.Status, body, want)
		}
	}
}
