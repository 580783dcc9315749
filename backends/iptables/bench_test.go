package iptables

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// benchLoaded returns a backend of flavour fl holding plan p in a fresh
// namespace that lives as long as owner; b is the running benchmark.
func benchLoaded(b, owner *testing.B, fl string, p *plan.Plan) *Backend {
	be, err := New(Options{Common: backends.Common{NetNS: netns.Empty(b, owner)}, Flavour: fl})
	if err != nil {
		b.Fatal(err)
	}
	owner.Cleanup(func() { be.Close() })
	if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkSync10k measures, per flavour, syncs of 10k services × 10
// endpoints (nat: 10k KUBE-SVC and 100k KUBE-SEP chains, ~330k rules):
// "cold" is the first full sync into an empty namespace, "rewrite" a full
// sync that rewrites every chain over the loaded tables (hourly, or after a
// failure), "reconcile" the full sync of every syncPeriod in between (no
// change in the plan or the kernel: the stamp shows the tables untouched,
// nothing is written), "partial" the replacement of one endpoint of one
// service. Pick rows with -bench, e.g. -bench 'Sync10k/legacy'.
func BenchmarkSync10k(b *testing.B) {
	ctx := context.Background()
	for _, fl := range []string{flavourLegacy, flavourNFT} {
		b.Run(fl, func(fb *testing.B) {
			fb.Run("cold", func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					p := benchkit.Plan(10000, 10, 1)
					be, err := New(Options{Common: backends.Common{NetNS: netns.Empty(b, b)}, Flavour: fl})
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if err := be.Sync(ctx, p, backends.FullSync()); err != nil {
						b.Fatal(err)
					}
				}
			})
			var be *Backend
			p := benchkit.Plan(10000, 10, 1)
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
					if err := be.Sync(ctx, p, backends.FullSync()); err != nil {
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
					if err := be.Sync(ctx, p, backends.PartialSync(key)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkCheck10k measures, per flavour, what checking 10k services ×
// 10 endpoints costs: "look" is the periodic full sync's look at the
// kernel's tables (both families' nat and filter, then the comparison with
// what was written), paid every syncPeriod after someone else changed the
// tables; "readback" is ReadBack (iptables-save of both families' nat and
// filter, then the parse) and its comparison with Expected, what weir
// verify and the soak checker pay, never a sync.
func BenchmarkCheck10k(b *testing.B) {
	for _, fl := range []string{flavourLegacy, flavourNFT} {
		b.Run(fl, func(fb *testing.B) {
			p := benchkit.Plan(10000, 10, 1)
			var be *Backend
			loaded := func(b *testing.B) *Backend {
				if be == nil {
					be = benchLoaded(b, fb, fl, p)
				}
				return be
			}
			fb.Run("look", func(b *testing.B) {
				be := loaded(b)
				b.ResetTimer()
				for range b.N {
					for _, fam := range be.fams {
						look, err := be.lookFamily(context.Background(), fam.f)
						if err != nil {
							b.Fatal(err)
						}
						if diffs, n, _ := drift(fam.last, newRenderer(fam.f, &be.opts, p.Node), look, driftLimit); n > 0 {
							b.Fatalf("IPv%d: %d differences right after a sync: %v", fam.f, n, diffs)
						}
					}
				}
			})
			fb.Run("readback", func(b *testing.B) {
				be := loaded(b)
				b.ResetTimer()
				for range b.N {
					v, err := be.ReadBack(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					want, owners := be.Expected(p)
					if divs := backends.Compare(want, owners, v); len(divs) > 0 {
						b.Fatalf("%d divergences right after a sync, the first: %s", len(divs), divs[0])
					}
				}
			})
		})
	}
}

// BenchmarkRestart1k measures, per flavour, what a restart costs the
// iptables backend at the soak's scale (1k services × 10 endpoints, one in
// five dual-stack): New,
// which detects the flavour when asked for auto, and its first full sync,
// which takes over and rewrites the tables an earlier process left.
func BenchmarkRestart1k(b *testing.B) {
	for _, fl := range []string{flavourLegacy, flavourNFT} {
		b.Run(fl, func(b *testing.B) {
			p := benchkit.Plan(1000, 10, 1)
			benchkit.DualStack(p, 5)
			netNS := benchLoaded(b, b, fl, p).opts.NetNS
			b.ResetTimer()
			for range b.N {
				be, err := New(Options{Common: backends.Common{NetNS: netNS, Log: slog.New(slog.DiscardHandler)}, Flavour: "auto"})
				if err != nil {
					b.Fatal(err)
				}
				if be.Flavour() != fl {
					b.Fatalf("auto chose %s over tables of %s", be.Flavour(), fl)
				}
				if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
