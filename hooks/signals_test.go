package hooks

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// fakeSignals is a SignalSource of our own making: it returns, for every
// endpoint, the signals set for its address and port, and counts its reads
// and the services each read asked for.
type fakeSignals struct {
	mu    sync.Mutex
	by    map[netip.AddrPort]abi.Signals
	reads int
	asked []plan.Key
	err   error
	skip  bool // leave every service unread (nil), as a reading out of budget
}

func (f *fakeSignals) set(s *plan.Service, i int, sig abi.Signals) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[netip.AddrPort]abi.Signals{}
	}
	f.by[s.Endpoints[i].AddrPort()] = sig
}

func (f *fakeSignals) Signals(_ context.Context, services []*plan.Service) ([][]abi.Signals, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	f.asked = f.asked[:0]
	if f.err != nil {
		return nil, f.err
	}
	out := make([][]abi.Signals, len(services))
	for i, s := range services {
		f.asked = append(f.asked, s.Key)
		if f.skip {
			continue
		}
		out[i] = make([]abi.Signals, len(s.Endpoints))
		for j, e := range s.Endpoints {
			out[i][j] = f.by[e.AddrPort()]
		}
	}
	return out, nil
}

func signalPlugin(name string) Config {
	return Config{Name: name, Path: guest("signals"), Signals: []string{SignalConnections}, Interval: time.Second,
		Match: Match{Namespaces: []string{"load"}}}
}

func poll(t *testing.T, c *Chain, src SignalSource) []plan.Key {
	t.Helper()
	keys, err := c.Poll(context.Background(), src)
	if err != nil {
		t.Fatalf("Poll: %v", err)
	}
	return keys
}

// TestChainSignals follows one service through the signal cycle: a moved
// signal is reported once per interval, the next Apply of the unchanged
// planned service calls the plugin with the signals, an unchanged output
// keeps its pointer (nothing to commit), and services the plugin does not
// match are neither read nor sent.
func TestChainSignals(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	c, _ := newChain(t, Options{Now: clk.Now}, Config{Name: "reweight", Path: guest("reweight")}, signalPlugin("sig"))
	if got := c.SignalInterval(); got != time.Second {
		t.Fatalf("SignalInterval = %v, want 1s", got)
	}
	web, other := svc("load", "web", 3), svc("default", "other", 2)
	in := []*plan.Service{web, other}
	out, err := apply(c, in, true)
	if err != nil {
		t.Fatal(err)
	}
	if w := weights(out[0]); !slices.Equal(w, []uint32{1, 1, 1}) {
		t.Fatalf("weights before any signal: %v", w)
	}
	src := &fakeSignals{}
	if keys := poll(t, c, src); len(keys) != 0 || !slices.Equal(src.asked, []plan.Key{web.Key}) {
		t.Fatalf("Poll without load: keys %v, asked %v; want none, and only %s asked", keys, src.asked, web.Key)
	}

	src.set(web, 0, abi.Signals{Active: 9, New: 2})
	if keys := poll(t, c, src); len(keys) != 0 || src.reads != 1 {
		t.Fatalf("Poll within the interval: keys %v after %d reads, want none and no read", keys, src.reads)
	}
	clk.advance(time.Second)
	if keys := poll(t, c, src); !slices.Equal(keys, []plan.Key{web.Key}) {
		t.Fatalf("Poll after a move: keys %v, want %s", keys, web.Key)
	}
	calls, _ := stats(c, "sig")
	moved, err := apply(c, []*plan.Service{web}, false)
	if err != nil {
		t.Fatal(err)
	}
	if w := weights(moved[0]); !slices.Equal(w, []uint32{10, 1, 1}) {
		t.Fatalf("weights with 9 active connections on the first endpoint: %v, want [10 1 1]", w)
	}
	if got, _ := stats(c, "sig"); got != calls+1 {
		t.Fatalf("the plugin got %d calls for one moved service, want 1", got-calls)
	}
	again, _ := apply(c, []*plan.Service{web}, false)
	if again[0] != moved[0] {
		t.Error("a second Apply without a move called the plugin again")
	}

	// Only New moves: the plugin is called, its output is the same, and
	// the chain keeps the pointer it had, so nothing reaches the backend.
	src.set(web, 0, abi.Signals{Active: 9, New: 5})
	clk.advance(time.Second)
	if keys := poll(t, c, src); !slices.Equal(keys, []plan.Key{web.Key}) {
		t.Fatalf("Poll after New moved: keys %v", keys)
	}
	same, _ := apply(c, []*plan.Service{web}, false)
	if same[0] != moved[0] {
		t.Error("an unchanged output got a new pointer")
	}
	clk.advance(time.Second)
	if keys := poll(t, c, src); len(keys) != 0 {
		t.Errorf("Poll without a move: keys %v", keys)
	}

	// A change of the service sends the latest signals, by endpoint.
	web2 := web.Clone()
	web2.Endpoints = slices.Insert(web2.Endpoints, 0, web.Endpoints[2])
	web2.Endpoints = web2.Endpoints[:3]
	out, _ = apply(c, []*plan.Service{web2}, false)
	if w := weights(out[0]); !slices.Equal(w, []uint32{1, 10, 1}) {
		t.Errorf("weights after the endpoints moved: %v, want [1 10 1]", w)
	}

	c.Forget(web.Key)
	clk.advance(time.Second)
	reads := src.reads
	if keys := poll(t, c, src); len(keys) != 0 || src.reads != reads {
		t.Errorf("Poll after Forget: keys %v, %d reads", keys, src.reads-reads)
	}
}

// TestChainSignalsFailure: a source that cannot be read is Poll's error and
// moves nothing, and a service it leaves unread keeps its last reading.
func TestChainSignalsFailure(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	c, _ := newChain(t, Options{Now: clk.Now}, signalPlugin("sig"))
	web := svc("load", "web", 2)
	if _, err := apply(c, []*plan.Service{web}, true); err != nil {
		t.Fatal(err)
	}
	src := &fakeSignals{err: errors.New("netlink: no buffer space")}
	if _, err := c.Poll(context.Background(), src); err == nil || !strings.Contains(err.Error(), "no buffer space") {
		t.Fatalf("Poll of a failing source: %v", err)
	}
	src.err = nil
	src.set(web, 1, abi.Signals{Active: 4})
	clk.advance(time.Second)
	if keys := poll(t, c, src); len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	out, _ := apply(c, []*plan.Service{web}, false)
	if w := weights(out[0]); !slices.Equal(w, []uint32{1, 5}) {
		t.Errorf("weights %v, want [1 5]", w)
	}

	// A service the source left unread keeps its reading: nothing moves,
	// and the next reading compares with the last one that was made.
	src.skip = true
	src.set(web, 1, abi.Signals{})
	clk.advance(time.Second)
	if keys := poll(t, c, src); len(keys) != 0 {
		t.Errorf("Poll of an unread service: keys %v", keys)
	}
	src.skip = false
	src.set(web, 1, abi.Signals{Active: 4})
	clk.advance(time.Second)
	if keys := poll(t, c, src); len(keys) != 0 {
		t.Errorf("Poll of the same signals after an unread one: keys %v", keys)
	}
}

// TestLoadSignalsNeedVersion2: a plugin of ABI version 1 cannot have
// signals, and New says why.
func TestLoadSignalsNeedVersion2(t *testing.T) {
	cfg := Config{Name: "old", Path: guest("raw"), Signals: []string{SignalConnections}, FailurePolicy: PolicyClosed}
	got := newErr(t, cfg)
	if !strings.Contains(got, "speaks plugin ABI version 1, which carries no signals") {
		t.Errorf("New returned %q", got)
	}
}

// TestCheckSignals: the signals and interval keys refuse what they must.
func TestCheckSignals(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		key string
	}{
		{Config{Signals: []string{"cpu"}}, "signals"},
		{Config{Interval: time.Second}, "interval"},
		{Config{Signals: []string{SignalConnections}, Interval: time.Millisecond}, "interval"},
		{Config{Signals: []string{SignalConnections}, Interval: 2 * time.Hour}, "interval"},
	} {
		c.cfg.Name, c.cfg.Path = "p", "p.wasm"
		errs := Check([]Config{c.cfg})
		if len(errs) != 1 || errs[0].Key != c.key {
			t.Errorf("Check(%+v) = %v, want one error for %s", c.cfg, errs, c.key)
		}
	}
	ok := Config{Name: "p", Path: "p.wasm", Signals: []string{SignalConnections}, Interval: 100 * time.Millisecond}
	if errs := Check([]Config{ok}); len(errs) != 0 {
		t.Errorf("Check refused %+v: %v", ok, errs)
	}
}
