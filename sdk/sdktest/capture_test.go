package sdktest

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
)

// chatty writes a line to stderr for every service, and a partial last line.
var chatty = guest.Plugin{Process: func(b *abi.Batch) error {
	for i := range b.Len() {
		fmt.Fprintf(os.Stderr, "saw %s\n", b.Service(i).Name())
	}
	fmt.Fprint(os.Stderr, "done")
	return nil
}}

func TestCaptureStderr(t *testing.T) {
	saved := os.Stderr
	in := services()
	out, lines, err := Capture(chatty, "", plan.Node{Name: "n1"}, in...)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"saw cart", "saw db", "done"}; !slices.Equal(lines, want) {
		t.Errorf("stderr lines %q, want %q", lines, want)
	}
	if out[0] != in[0] || out[1] != in[1] {
		t.Error("services the plugin left alone are not returned as themselves")
	}
	if os.Stderr != saved {
		t.Error("Capture left os.Stderr replaced")
	}
}

func TestCaptureFailureLines(t *testing.T) {
	p := guest.Plugin{Process: func(b *abi.Batch) error {
		fmt.Fprintln(os.Stderr, "about to look")
		b.Service(9)
		return nil
	}}
	_, lines, err := Capture(p, "", plan.Node{Name: "n1"}, services()...)
	if err == nil || len(lines) != 2 || lines[0] != "about to look" {
		t.Fatalf("err %v, lines %q: want an error after 2 lines", err, lines)
	}
	if !strings.HasPrefix(lines[1], "panic: abi: service index 9 out of range") || !strings.Contains(lines[1], "capture_test.go:") {
		t.Errorf("panic line %q does not say where the plugin panicked", lines[1])
	}
	if !strings.Contains(err.Error(), "plugin stderr: about to look\npanic: ") {
		t.Errorf("error %q lacks the stderr lines", err)
	}
}

func TestCaptureConcurrently(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, lines, err := Capture(chatty, "", plan.Node{Name: "n1"}, services()...)
			if err == nil && len(lines) != 3 {
				err = fmt.Errorf("lines %q", lines)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// readFlags is a plugin that reports each endpoint's Local and ForLocal
// flags as it sees them, by setting its weight to 1 + 2*Local + 4*ForLocal.
var readFlags = guest.Plugin{Process: func(b *abi.Batch) error {
	for i := range b.Len() {
		s := b.Service(i)
		for j := range s.Len() {
			e := s.Endpoint(j)
			w := uint32(1)
			if e.Local() {
				w += 2
			}
			if e.ForLocal() {
				w += 4
			}
			e.SetWeight(w)
		}
	}
	return nil
}}

func TestRunSetsLocal(t *testing.T) {
	node := plan.Node{Name: "n1"}
	terminating := Endpoint("10.1.0.3", 80, "n1", "z", "old")
	terminating.Ready, terminating.Terminating = false, true
	v6 := Endpoint("fd00::9", 80, "n1", "z", "v6")
	v6.Ready, v6.Terminating = false, true
	local := Service("ns", "local", "10.96.0.1", 80,
		Endpoint("10.1.0.1", 80, "n1", "z", "here"), Endpoint("10.1.0.2", 80, "n2", "z", "there"), terminating, v6)
	local.InternalLocal = true
	cluster := Service("ns", "cluster", "10.96.0.2", 80,
		Endpoint("10.1.0.1", 80, "n1", "z", "here"), Endpoint("10.1.0.2", 80, "n2", "z", "there"))
	external := Service("ns", "ext", "10.96.0.3", 80, Endpoint("10.1.0.1", 80, "n1", "z", "here"))
	external.ExternalLocal, external.NodePort = true, 30080
	out, err := Run(readFlags, "", node, local, cluster, external)
	if err != nil {
		t.Fatal(err)
	}
	// here: local, ready: ForLocal; there: neither; old: local but a ready
	// local endpoint exists; v6: local, the only IPv6 one, terminating and
	// serving: ForLocal.
	for i, want := range [][]uint32{{7, 1, 3, 7}, {3, 1}, {7}} {
		var got []uint32
		for _, e := range out[i].Endpoints {
			got = append(got, e.Weight)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: weights %v, want %v (1 + 2 Local + 4 ForLocal)", out[i].Key, got, want)
		}
	}
	if !local.Endpoints[0].Local || local.Endpoints[1].Local || !local.Endpoints[0].ForLocal {
		t.Errorf("Run did not set the flags on its input: %+v", local.Endpoints[:2])
	}
	if a := netip.MustParseAddr("fd00::9"); local.Endpoints[3].Address != a || !local.Endpoints[3].ForLocal {
		t.Errorf("the IPv6 family was not marked on its own: %+v", local.Endpoints[3])
	}
}
