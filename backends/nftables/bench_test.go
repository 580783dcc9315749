package nftables

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
)

func benchmarkFullSync(b *testing.B, n int) {
	be, err := New(Options{Common: backends.Common{NetNS: benchkit.NetNS(b, b)}})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	p := benchkit.Plan(n, 10, 1)
	b.ResetTimer()
	for range b.N {
		be.refilled = time.Time{} // refill as after another process's commit, or hourly
		if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFullSync1k refills the whole table holding 1k services × 10 endpoints.
func BenchmarkFullSync1k(b *testing.B) { benchmarkFullSync(b, 1000) }

// BenchmarkFullSync10k refills the whole table holding 10k services × 10 endpoints.
func BenchmarkFullSync10k(b *testing.B) { benchmarkFullSync(b, 10000) }

// BenchmarkQuietFullSync10k is the periodic full sync of 10k services when
// nothing committed since Weir's last commit: the generation vouches for
// the tables, nothing is written.
func BenchmarkQuietFullSync10k(b *testing.B) {
	be, p, _ := syncedScale(b)
	b.ResetTimer()
	for range b.N {
		if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
			b.Fatal(err)
		}
	}
}

// syncedScale returns a backend holding 10k services × 10 endpoints and the
// key of one of them.
func syncedScale(b *testing.B) (*Backend, *plan.Plan, plan.Key) {
	be, err := New(Options{Common: backends.Common{NetNS: benchkit.NetNS(b, b)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	p := benchkit.Plan(10000, 10, 1)
	if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
		b.Fatal(err)
	}
	return be, p, plan.Key{Namespace: "bench", Name: "svc-5000", Port: "http", Protocol: plan.TCP}
}

// BenchmarkOneEndpointChange10k replaces one endpoint of one service among 10k.
func BenchmarkOneEndpointChange10k(b *testing.B) {
	be, p, key := syncedScale(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		s := p.Services[key].Clone()
		s.Endpoints[3].Address = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		p.Services[key] = s
		if err := be.Sync(ctx, p, backends.PartialSync(key)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScaleDown10k removes one endpoint of a service among 10k, which
// moves it to another pick chain.
func BenchmarkScaleDown10k(b *testing.B) {
	be, p, key := syncedScale(b)
	ctx := context.Background()
	full := p.Services[key]
	b.ResetTimer()
	for i := range b.N {
		s := full.Clone()
		if i%2 == 0 {
			s.Endpoints = s.Endpoints[:9]
		}
		p.Services[key] = s
		if err := be.Sync(ctx, p, backends.PartialSync(key)); err != nil {
			b.Fatal(err)
		}
	}
}

// benchmarkReadBack reads back the tables holding n services × 10
// endpoints and rebuilds their View: what weir diagnose and the soak
// checker pay per check.
func benchmarkReadBack(b *testing.B, n int) {
	be, err := New(Options{Common: backends.Common{NetNS: benchkit.NetNS(b, b)}})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	p := benchkit.Plan(n, 10, 1)
	ctx := context.Background()
	if err := be.Sync(ctx, p, backends.FullSync()); err != nil {
		b.Fatal(err)
	}
	want, owners := be.Expected(p)
	b.ResetTimer()
	for range b.N {
		got, err := be.ReadBack(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if divs := backends.Compare(want, owners, got); len(divs) > 0 {
			b.Fatalf("%d divergences, the first: %s", len(divs), divs[0])
		}
		b.StartTimer()
	}
}

// BenchmarkReadBack1k reads back 1k services × 10 endpoints.
func BenchmarkReadBack1k(b *testing.B) { benchmarkReadBack(b, 1000) }

// BenchmarkReadBack10k reads back 10k services × 10 endpoints.
func BenchmarkReadBack10k(b *testing.B) { benchmarkReadBack(b, 10000) }

// BenchmarkFullSyncSticky1k refills the table holding 1k services × 10
// endpoints, every one with ClientIP affinity: a chain per service and kind
// and a set per endpoint, as kube-proxy builds them.
func BenchmarkFullSyncSticky1k(b *testing.B) {
	be, err := New(Options{Common: backends.Common{NetNS: benchkit.NetNS(b, b)}})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	p := benchkit.Plan(1000, 10, 1)
	for _, s := range p.Services {
		s.Affinity = &plan.Affinity{TimeoutSeconds: 10800}
	}
	b.ResetTimer()
	for range b.N {
		be.refilled = time.Time{}
		if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
			b.Fatal(err)
		}
	}
}
