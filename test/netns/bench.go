package netns

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
)

// Empty creates an empty network namespace for a benchmark and returns a
// file descriptor of it; the namespace is removed when owner ends, and b
// is the running benchmark. Without root it skips b, or fails it under
// CI=true (see RequireRoot).
func Empty(b, owner *testing.B) int {
	b.Helper()
	RequireRoot(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		b.Fatal(err)
	}
	defer orig.Close()
	// The pid and the clock keep parallel runs and sub-benchmarks apart.
	name := fmt.Sprintf("weir-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	ns, err := vnetns.NewNamed(name)
	if err != nil {
		b.Fatal(err)
	}
	owner.Cleanup(func() {
		ns.Close()
		if err := vnetns.DeleteNamed(name); err != nil {
			owner.Errorf("delete the benchmark's namespace %s: %v", name, err)
		}
	})
	if err := vnetns.Set(orig); err != nil {
		b.Fatal(err)
	}
	return int(ns)
}
