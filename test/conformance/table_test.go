package conformance

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/weirproxy/weir/core/proxy"
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
