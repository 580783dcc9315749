package hooks

import (
	"slices"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// TestModulesShared shows that plugins loaded from the same file under the
// same memory limit share one compiled module, that another limit gets its
// own, and that releasing one plugin leaves the others working, until the
// last one closes the module.
func TestModulesShared(t *testing.T) {
	first := reweight("first", "w1")
	first.FailurePolicy = PolicyOpen // passes through once unloaded below
	second := reweight("second", "w2")
	bigger := reweight("bigger", "w3")
	bigger.MemoryLimit = 128 << 20
	c, _ := newChain(t, Options{}, first, second, bigger)
	a, b, big := c.slots[0].p, c.slots[1].p, c.slots[2].p
	if a.mod != b.mod {
		t.Error("two plugins of one file and one memory limit compiled it twice")
	}
	if big.mod == a.mod {
		t.Error("plugins with different memory limits share a runtime")
	}
	if refs(c, a.mod) != 2 || refs(c, big.mod) != 1 {
		t.Errorf("references %d and %d, want 2 and 1", refs(c, a.mod), refs(c, big.mod))
	}
	// Unload the first plugin as a failed reload would leave it.
	c.mu.Lock()
	c.slots[0].p = nil
	c.mu.Unlock()
	if err := a.close(); err != nil {
		t.Fatal(err)
	}
	if refs(c, b.mod) != 1 {
		t.Errorf("after one of two closed, %d references, want 1", refs(c, b.mod))
	}
	// The second plugin makes fresh instances from the shared module.
	b.mu.Lock()
	idle := b.idle
	b.idle = nil
	b.mu.Unlock()
	for _, inst := range idle {
		inst.close()
	}
	out, err := apply(c, []*plan.Service{svc("default", "s", 2, "w1", "3", "w2", "4")}, true)
	if err != nil || !slices.Equal(weights(out[0]), []uint32{4, 4}) {
		t.Fatalf("after releasing the first plugin: weights %v, %v; want [4 4]", weights(out[0]), err)
	}
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(c.mods.byKey); n != 0 {
		t.Errorf("%d modules still registered after Close", n)
	}
}

// refs returns m's reference count.
func refs(c *Chain, m *module) int {
	c.mods.mu.Lock()
	defer c.mods.mu.Unlock()
	return m.refs
}
