package planner_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/tracker"
)

func TestServiceWithoutServiceObject(t *testing.T) {
	// Slices whose service is unknown (or deleted) produce nothing.
	states := readStates(t, filepath.Join("testdata", "clusterip.yaml"))
	st := states["shop/web"]
	st.Service = nil
	services, problems := planner.Service(planner.Config{NodeName: "node-a", Zone: "zone-a"}, st)
	if services != nil || problems != nil {
		t.Errorf("Service(nil service) = %v, %v; want nothing", services, problems)
	}
	services, problems = planner.Service(planner.Config{NodeName: "node-a", Zone: "zone-a"}, tracker.ServiceState{})
	if services != nil || problems != nil {
		t.Errorf("Service(empty state) = %v, %v; want nothing", services, problems)
	}
}

// TestServiceSliceOrder checks that the planned services do not depend on
// the order the slices arrive in.
func TestServiceSliceOrder(t *testing.T) {
	cases, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := planner.Config{NodeName: "node-a", Zone: "zone-a"}
	for _, in := range cases {
		for name, st := range readStates(t, in) {
			if len(st.Slices) < 2 {
				continue
			}
			want, _ := planner.Service(cfg, st)
			rev := st
			rev.Slices = slices.Clone(st.Slices)
			slices.Reverse(rev.Slices)
			got, _ := planner.Service(cfg, rev)
			if text(got) != text(want) {
				t.Errorf("%s %s: slices reversed give\n%s\nwant\n%s", in, name, text(got), text(want))
			}
		}
	}
}

func text[T interface{ String() string }](items []T) string {
	var b strings.Builder
	for _, it := range items {
		b.WriteString(it.String())
	}
	return b.String()
}
