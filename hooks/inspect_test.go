package hooks

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// TestChainChanges checks that Changes reports what each plugin did to a
// service in the last Apply, in chain order, for the version planned (a
// clone too), and nothing for a version the plugins have not seen.
func TestChainChanges(t *testing.T) {
	c, _ := newChain(t, Options{}, reweight("first", "w1"), reweight("second", "w2"))
	both := svc("default", "both", 2, "w1", "2", "w2", "5")
	one := svc("default", "one", 1, "w1", "2")
	none := svc("default", "none", 1)
	if _, err := apply(c, []*plan.Service{both, one, none}, true); err != nil {
		t.Fatal(err)
	}
	got := func(s *plan.Service) []change {
		var out []change
		for _, ch := range c.Changes(s) {
			out = append(out, change{ch.Plugin, ch.Before.Key, weights(ch.Before), weights(ch.After)})
		}
		return out
	}
	same := func(a, b change) bool {
		return a.plugin == b.plugin && a.key == b.key && slices.Equal(a.before, b.before) && slices.Equal(a.after, b.after)
	}
	wantBoth := []change{
		{"first", both.Key, []uint32{1, 1}, []uint32{2, 2}},
		{"second", both.Key, []uint32{2, 2}, []uint32{5, 5}},
	}
	for _, tt := range []struct {
		name string
		in   *plan.Service
		want []change
	}{
		{"both plugins", both, wantBoth},
		{"a clone of the planned version", both.Clone(), wantBoth},
		{"the first plugin only", one, []change{{"first", one.Key, []uint32{1}, []uint32{2}}}},
		{"neither", none, nil},
		{"a version not applied", with(both, "w1", "3"), nil},
		{"nil", nil, nil},
	} {
		if g := got(tt.in); !slices.EqualFunc(g, tt.want, same) {
			t.Errorf("%s: Changes = %v, want %v", tt.name, g, tt.want)
		}
	}
}

// TestChainLoadFailures checks that an open plugin New could not load is
// reported with its error, and a loaded one is not.
func TestChainLoadFailures(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.wasm")
	c, _ := newChain(t, Options{}, Config{Name: "noop", Path: guest("noop")},
		Config{Name: "gone", Path: missing, FailurePolicy: PolicyOpen})
	got := c.LoadFailures()
	if len(got) != 1 || got[0].Plugin != "gone" || !errors.Is(got[0].Err, fs.ErrNotExist) {
		t.Errorf("LoadFailures = %v, want gone's file missing alone", got)
	}
	if ok, _ := newChain(t, Options{}, Config{Name: "noop", Path: guest("noop")}); ok.LoadFailures() != nil {
		t.Errorf("LoadFailures of a loaded chain = %v, want nil", ok.LoadFailures())
	}
}
