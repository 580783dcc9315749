package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// benchNetNS creates an empty network namespace and removes it when owner
// ends; b is the running benchmark.
func benchNetNS(b *testing.B, owner *testing.B) int {
	b.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			b.Fatal("needs root: creates a network namespace (CI=true: kernel benchmarks must run)")
		}
		b.Skip("needs root: creates a network namespace")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		b.Fatal(err)
	}
	defer orig.Close()
	name := fmt.Sprintf("weir-ipt-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	ns, err := vnetns.NewNamed(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := vnetns.Set(orig); err != nil {
		b.Fatal(err)
	}
	owner.Cleanup(func() { ns.Close(); vnetns.DeleteNamed(name) })
	return int(ns)
}

// benchPlan returns n services with eps endpoints each; the first 2700 have
// node ports.
func benchPlan(n, eps int) *plan.Plan {
	p := &plan.Plan{Services: make(map[plan.Key]*plan.Service, n)}
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
		}
		if i < 2700 {
			s.NodePort = uint16(30000 + i)
		}
		for j := range eps {
			s.Endpoints = append(s.Endpoints, plan.Endpoint{
				Address: netip.AddrFrom4([4]byte{10, 128 + byte(i>>12), byte(i >> 4), byte(i<<4) + byte(j)}),
				Port:    8080, Ready: true, Serving: true, ForCluster: true, Weight: 1,
			})
		}
		p.Services[s.Key] = s
	}
	return p
}

// benchLoaded returns a backend of flavour fl holding plan p in a fresh
// namespace that lives as long as owner; b is the running benchmark.
func benchLoaded(b, owner *testing.B, fl string, p *plan.Plan) *Backend {
	be, err := New(Options{Common: backends.Common{NetNS: benchNetNS(b, owner)}, Flavour: fl})
	if err != nil {
		b.Fatal(err)
	}
	owner.Cleanup(func() { be.Close() })
	if err := be.Sync(context.Background(), p, nil); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkSync10k measures, per flavour, syncs of 10k services × 10
// endpoints (nat: 10k KUBE-SVC and 100k KUBE-SEP chains, ~330k rules):
// "cold" is the first full sync into an empty namespace, "rewrite" a full
// sync that rewrites every chain over the loaded tables (hourly, or after a
// failure), "reconcile" the full sync of every syncPeriod in between (no
// change: nothing written), "partial" the replacement of one endpoint of
// one service. Pick rows with -bench, e.g. -bench 'Sync10k/legacy'.
func BenchmarkSync10k(b *testing.B) {
	ctx := context.Background()
	for _, fl := range []string{flavourLegacy, flavourNFT} {
		b.Run(fl, func(fb *testing.B) {
			fb.Run("cold", func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					p := benchPlan(10000, 10)
					be, err := New(Options{Common: backends.Common{NetNS: benchNetNS(b, b)}, Flavour: fl})
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if err := be.Sync(ctx, p, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
			var be *Backend
			p := benchPlan(10000, 10)
			loaded := func(b *testing.B) *Backend {
				if be == nil {
					be = benchLoaded(b, fb, fl, p)
				}
				return be
			}
			full := func(b *testing.B, period time.Duration) {
				be := loaded(b)
				be.opts.RewritePeriod = period
				defer func() { be.opts.RewritePeriod = 0 }()
				b.ResetTimer()
				for range b.N {
					if err := be.Sync(ctx, p, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			fb.Run("rewrite", func(b *testing.B) { full(b, time.Nanosecond) })
			fb.Run("reconcile", func(b *testing.B) { full(b, 0) })
			fb.Run("partial", func(b *testing.B) {
				be := loaded(b)
				key := plan.Key{Namespace: "bench", Name: "svc-5000", Port: "http", Protocol: plan.TCP}
				b.ResetTimer()
				for i := range b.N {
					s := p.Services[key].Clone()
					s.Endpoints[3].Address = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
					p.Services[key] = s
					if err := be.Sync(ctx, p, []plan.Key{key}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
