package hooks

import "github.com/weirproxy/weir/sdk/plan"

// Change is what one plugin did to one service port in the chain's last
// Apply that sent it: its input and its output.
type Change struct {
	Plugin        string
	Before, After *plan.Service
}

// Changes returns what each plugin changed of the service port planned
// on its way through the chain, in chain order, from the plugins' caches:
// a plugin that did not see planned's version, or passed it unchanged,
// has none. It costs one lookup per plugin, for weir diagnose.
func (c *Chain) Changes(planned *plan.Service) []Change {
	if planned == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Change
	cur := planned
	for _, s := range c.slots {
		e, ok := s.cache[planned.Key]
		if !ok || (e.in != cur && !e.in.Equal(cur)) {
			continue
		}
		if e.in != e.out && !e.in.Equal(e.out) {
			out = append(out, Change{Plugin: s.Name, Before: e.in, After: e.out})
		}
		cur = e.out
	}
	return out
}

// LoadFailure is a plugin New could not load, and why.
type LoadFailure struct {
	Plugin string
	Err    error
}

// LoadFailures returns the plugins New could not load (open ones: a
// closed one fails New) that are still not loaded, in chain order; nil
// when every plugin is loaded. Such a plugin passes its services through
// unchanged; weir plan and weir plugin test report it.
func (c *Chain) LoadFailures() []LoadFailure {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []LoadFailure
	for _, s := range c.slots {
		if s.p == nil && s.loadErr != nil {
			out = append(out, LoadFailure{Plugin: s.Name, Err: s.loadErr})
		}
	}
	return out
}
