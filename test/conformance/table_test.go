package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/weirproxy/weir/core/proxy"
	"github.com/weirproxy/weir/test/netns"
)

// TestTableIsWellFormed checks every row without a kernel, so a broken row
// shows up on any machine: names unique, manifests decode strictly and plan
// without a warning at every step, probes name known places, addresses and
// sources, and every row asserts something that an answer proves.
func TestTableIsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Rows() {
		t.Run(r.Name, func(t *testing.T) {
			if r.Name == "" || seen[r.Name] || strings.ContainsAny(r.Name, " /") {
				t.Fatalf("row name %q: want a unique kebab-case name", r.Name)
			}
			seen[r.Name] = true
			log := &warnings{}
			px := proxy.New(proxy.Options{NodeName: NodeName, Log: slog.New(log.handler(slog.DiscardHandler))})
			objects := newStore()
			phases := append([]Step{{Name: "initial", Apply: r.Manifests, Full: true, Probes: r.Probes}}, r.Then...)
			answered := false
			for _, s := range phases {
				objs, err := decodeManifests(s.Apply)
				if err != nil {
					t.Fatalf("%s: %v", s.Name, err)
				}
				for _, o := range objs {
					objects.apply(px.Handler(), o)
				}
				for _, name := range s.Delete {
					if err := objects.delete(px.Handler(), name); err != nil {
						t.Fatalf("%s: %v", s.Name, err)
					}
				}
				if err := px.Sync(context.Background(), s.Full); err != nil {
					t.Fatalf("%s: %v", s.Name, err)
				}
				if w := log.take(); len(w) > 0 {
					t.Errorf("%s: the planner warned: %s", s.Name, strings.Join(w, "; "))
				}
				for _, p := range s.Probes {
					if err := p.validate(); err != nil {
						t.Errorf("%s: %s: %v", s.Name, p, err)
					}
					answered = answered || len(p.Want.pods) > 0
				}
			}
			if !answered {
				t.Error("no probe expects an answer: the row could pass with nothing programmed")
			}
		})
	}
}

// TestDifferences checks how a probe's Differences apply: to the proxy
// they name, in every mode or one, and not to others; and that a
// difference without its reason or with a bad want is refused.
func TestDifferences(t *testing.T) {
	p := Probe{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a"), Source: "client",
		Differs: []Difference{{Proxy: "kube-proxy/iptables", Want: Refused, Why: "an example"}}}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Want{"kube-proxy/iptables": Refused, "kube-proxy/nftables": Pods("pod-a"), "other": Pods("pod-a")} {
		got := p.forProxy(name)
		if got.Want.String() != want.String() || got.Differs != nil {
			t.Errorf("for %s: want %s, got %s (differs %v)", name, want, got.Want, got.Differs)
		}
		if want.kind == wantRefused && got.Source != "" {
			t.Errorf("for %s: the probe's source %q still checked", name, got.Source)
		}
	}
	p.Differs[0].Proxy = "kube-proxy"
	if got := p.forProxy("kube-proxy/nftables"); got.Want.kind != wantRefused {
		t.Errorf(`"kube-proxy" did not apply to every mode: %s`, got.Want)
	}
	for _, bad := range []Difference{{Proxy: "kube-proxy", Want: Refused}, {Proxy: "kube-proxy", Want: Refused, Source: "node", Why: "x"}} {
		p.Differs = []Difference{bad}
		if err := p.validate(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// TestByMode checks how a probe's per-mode wants apply: to Weir's backend
// of the mode and to kube-proxy in that mode, before any Difference; and
// that a bad entry is refused.
func TestByMode(t *testing.T) {
	p := Probe{From: "client", To: "10.96.0.10:80", Want: Refused,
		ByMode:  []ModeWant{{Mode: NFTables, Want: Dropped, Why: "an example"}},
		Differs: []Difference{{Proxy: "other/iptables", Want: Pods("pod-a"), Why: "an example"}}}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[Mode]Want{NFTables: Dropped, IPTables: Refused, IPVS: Refused} {
		if got := p.forMode(mode); got.Want.String() != want.String() || got.ByMode != nil {
			t.Errorf("mode %s: want %s, got %s (by mode %v)", mode, want, got.Want, got.ByMode)
		}
	}
	for name, want := range map[string]Want{"kube-proxy/nftables": Dropped, "kube-proxy/iptables": Refused, "other/iptables": Pods("pod-a")} {
		if got := p.forProxy(name); got.Want.String() != want.String() {
			t.Errorf("for %s: want %s, got %s", name, want, got.Want)
		}
	}
	for _, bad := range [][]ModeWant{{{Mode: "userspace", Want: Dropped, Why: "x"}}, {{Mode: IPVS, Want: Dropped}},
		{{Mode: IPVS, Want: Dropped, Why: "x"}, {Mode: IPVS, Want: Refused, Why: "y"}}, {{Mode: IPVS, Want: Dropped, Source: "node", Why: "x"}}} {
		p.ByMode = bad
		if err := p.validate(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// TestRefusedBySender checks that Refused fails on a datagram the
// prober's own namespace rejected (EPERM, then the ICMP error), which
// RefusedAtSend wants instead.
func TestRefusedBySender(t *testing.T) {
	sent := fmt.Errorf("udp: %w: %w", netns.ErrRefused, syscall.ECONNREFUSED)
	local := fmt.Errorf("udp: %w: %w: %w", netns.ErrRefused, netns.ErrSendRejected, syscall.EPERM)
	for _, c := range []struct {
		want Want
		err  error
		bad  bool
	}{{Refused, sent, false}, {Refused, local, true}, {RefusedAtSend, local, false}, {RefusedAtSend, sent, true}} {
		if got := c.want.contradicts(outcome{err: c.err}); got != c.bad {
			t.Errorf("%s with %v: contradicts %v, want %v", c.want, c.err, got, c.bad)
		}
	}
	if err := (Probe{From: "node", To: "node:30080", Want: RefusedAtSend}).validate(); err == nil {
		t.Error("RefusedAtSend for a TCP probe: accepted")
	}
}
