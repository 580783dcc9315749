//go:build vm

package ipvs

import (
	"context"
	"net/netip"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// Like the kernel tests, the benchmarks need IPVS: they build only with the
// vm tag and run inside the VM of `make bench-vm`.

// benchLoaded returns a backend holding plan p in a fresh namespace that
// lives as long as owner; b is the running benchmark.
func benchLoaded(b, owner *testing.B, p *plan.Plan) *Backend {
	be, err := New(Options{Common: backends.Common{NetNS: netns.Empty(b, owner)}})
	if err != nil {
		b.Fatal(err)
	}
	owner.Cleanup(func() { be.Close() })
	if err := be.Sync(context.Background(), p, backends.FullSync()); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkSync10k measures syncs of 10k ClusterIP services × 10 endpoints
// (10k addresses on the dummy interface, 10k virtual servers, 100k real
// servers; the namespace has no address for node ports): "initial" is the
// first full sync into an empty namespace, "full" a full sync over the
// loaded state (it reads every virtual and real server back and finds
// nothing to change), "readback" a ReadBack of it, "change" the
// replacement of one endpoint of one service (a partial sync: one real
// server added, one drained), "signals" a reading of every service's live
// signals.
func BenchmarkSync10k(b *testing.B) {
	ctx := context.Background()
	b.Run("initial", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			p := benchkit.Plan(10000, 10, 1)
			be, err := New(Options{Common: backends.Common{NetNS: netns.Empty(b, b)}})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			err = be.Sync(ctx, p, backends.FullSync())
			b.StopTimer()
			be.Close()
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	// "full" and "change" share one loaded namespace, owned by this
	// benchmark so that it outlives each of them. A load that failed is
	// not tried again by the next sub-benchmark.
	var be *Backend
	loadFailed := false
	p := benchkit.Plan(10000, 10, 1)
	loaded := func(sb *testing.B) *Backend {
		if loadFailed {
			sb.Fatal("loading the plan failed in an earlier sub-benchmark")
		}
		if be == nil {
			loadFailed = true // until benchLoaded returns
			be = benchLoaded(sb, b, p)
			loadFailed = false
		}
		return be
	}
	b.Run("full", func(b *testing.B) {
		be := loaded(b)
		b.ResetTimer()
		for range b.N {
			if err := be.Sync(ctx, p, backends.FullSync()); err != nil {
				b.Fatal(err)
			}
		}
	})
	// "readback" reads the loaded state back as weir verify and the soak
	// checker do (every virtual and real server, the interface, the
	// ipsets, iptables-save of three tables per family).
	b.Run("readback", func(b *testing.B) {
		be := loaded(b)
		b.ResetTimer()
		for range b.N {
			v, err := be.ReadBack(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(v.Destinations) != len(p.Services) || len(v.Anomalies) > 0 {
				b.Fatalf("read back %d destinations of %d, anomalies %q", len(v.Destinations), len(p.Services), v.Anomalies)
			}
		}
	})
	b.Run("change", func(b *testing.B) {
		be := loaded(b)
		key := plan.Key{Namespace: "bench", Name: "svc-5000", Port: "http", Protocol: plan.TCP}
		change := func(a netip.Addr) {
			s := p.Services[key].Clone()
			s.Endpoints[3].Address = a
			p.Services[key] = s
			if err := be.Sync(ctx, p, backends.PartialSync(key)); err != nil {
				b.Fatal(err)
			}
		}
		// One untimed change first: the graceful-termination loop's tick
		// that waited for the lock during a long full sync runs now, not
		// inside the first timed change.
		change(netip.AddrFrom4([4]byte{10, 201, 0, 0}))
		b.ResetTimer()
		for i := range b.N {
			change(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}))
		}
	})
	// "signals" reads the live signals of every service, as weir run
	// does each interval for a plugin with signals matching all of them:
	// one dump of real servers per virtual server.
	b.Run("signals", func(b *testing.B) {
		be := loaded(b)
		services := make([]*plan.Service, 0, len(p.Services))
		for _, s := range p.Services {
			services = append(services, s)
		}
		b.ResetTimer()
		read := 0
		for range b.N {
			sigs, err := be.Signals(ctx, services)
			if err != nil || len(sigs) != len(services) {
				b.Fatalf("Signals: %d services, %v", len(sigs), err)
			}
			for _, s := range sigs {
				if s != nil {
					read++
				}
			}
		}
		// Past its budget a reading leaves services unread.
		b.ReportMetric(float64(read)/float64(b.N), "services-read/op")
	})
}
