package main

import (
	"net"
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
