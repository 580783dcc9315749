package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// The scale benchmarks. Besides time and (with -benchmem) allocations,
// each reports what measure (footprint_test.go) sees: CPU time per op,
// the kernel's share of a commit included, and the memory the syncs hold:
// peak RSS above what the process held before, and heap still live after.

// shape is a cluster size: services × endpoints each; mixed mixes the
// types of services as hack/bench's clusters do (mixPlan).
type shape struct {
	services, endpoints int
	mixed               bool
}

// shapePlan returns the plan of a shape: mixPlan's when mixed,
// benchkit.Plan's for up to 16 endpoints, widePlan's for more, one node
// port per service up to 2700.
func shapePlan(s shape) *plan.Plan {
	switch {
	case s.mixed:
		return mixPlan(s.services, s.endpoints)
	case s.endpoints <= 16:
		return benchkit.Plan(s.services, s.endpoints, 1)
	}
	return widePlan(s.services, s.endpoints)
}

// mixPlan is benchkit.Plan with the service types of test/scale's
// clusters, which hack/bench runs the binary on: of every ten services,
// one has ClientIP affinity and two a load-balancer IP with two source
// ranges, one of those with externalTrafficPolicy Local (a third of the
// endpoints are this node's).
func mixPlan(n, eps int) *plan.Plan {
	p := benchkit.Plan(n, eps, 1)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}
	for _, s := range p.Services {
		var i int
		if _, err := fmt.Sscanf(s.Key.Name, "svc-%d", &i); err != nil {
			panic(err)
		}
		switch i % 10 {
		case 3:
			s.Affinity = &plan.Affinity{TimeoutSeconds: 10800}
		case 8, 9:
			s.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, byte(i >> 16), byte(i >> 8), byte(i)})}
			s.SourceRanges = ranges
			s.ExternalLocal = i%10 == 9
		}
		for j := range s.Endpoints {
			s.Endpoints[j].Local = j%3 == 0
			s.Endpoints[j].ForLocal = s.Endpoints[j].Local
		}
	}
	return p
}

// widePlan returns n TCP services wide/svc-0, ... with eps ready
// endpoints each, every endpoint at an address of its own (10.128.0.0/9
// holds eight million), the first 2700 with a node port.
func widePlan(n, eps int) *plan.Plan {
	p := &plan.Plan{Services: make(map[plan.Key]*plan.Service, n)}
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "wide", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
		}
		if i < 2700 {
			s.NodePort = uint16(30000 + i)
		}
		s.Endpoints = make([]plan.Endpoint, eps)
		for j := range eps {
			a := 128<<16 + i*eps + j
			s.Endpoints[j] = plan.Endpoint{Address: netip.AddrFrom4([4]byte{10, byte(a >> 16), byte(a >> 8), byte(a)}),
				Port: 8080, Ready: true, Serving: true, ForCluster: true, Weight: 1}
		}
		p.Services[s.Key] = s
	}
	return p
}

// newBenchBackend returns a backend programming an empty namespace of its
// own, closed when b ends.
func newBenchBackend(b *testing.B) *Backend {
	be := openBenchBackend(b, Options{})
	b.Cleanup(func() { be.Close() })
	return be
}

// openBenchBackend returns a backend with opts programming an empty
// namespace of its own, which the caller closes.
func openBenchBackend(b *testing.B, opts Options) *Backend {
	opts.NetNS = netns.Empty(b, b)
	be, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	return be
}

func mustSyncBench(b *testing.B, be *Backend, p *plan.Plan, req backends.SyncRequest) {
	if err := be.Sync(context.Background(), p, req); err != nil {
		b.Fatal(err)
	}
}

// benchmarkFirstSync times the first full sync of a shape into an empty
// namespace, each op with a backend of its own: what a start costs. The
// live heap is the last backend's.
func benchmarkFirstSync(b *testing.B, s shape, opts Options) {
	p := shapePlan(s)
	m := startMeasure(b, p)
	var be *Backend
	for range b.N {
		b.StopTimer()
		if be != nil {
			be.Close()
		}
		be = openBenchBackend(b, opts)
		b.StartTimer()
		m.op(func() { mustSyncBench(b, be, p, backends.FullSync()) })
	}
	m.report()
	be.Close()
}

// BenchmarkFirstSync10k is a start with 10k services × 10 endpoints.
func BenchmarkFirstSync10k(b *testing.B) { benchmarkFirstSync(b, shape{10000, 10, false}, Options{}) }

// BenchmarkFirstSync10kPlainBuckets is BenchmarkFirstSync10k with
// Options.PlainBuckets.
func BenchmarkFirstSync10kPlainBuckets(b *testing.B) {
	benchmarkFirstSync(b, shape{10000, 10, false}, Options{PlainBuckets: true})
}

// BenchmarkFirstSync100k is a start with 100k services × 10 endpoints.
func BenchmarkFirstSync100k(b *testing.B) { benchmarkFirstSync(b, shape{100000, 10, false}, Options{}) }

// BenchmarkFirstSyncMix10k is a start with 10k services × 10 endpoints
// of the types hack/bench runs.
func BenchmarkFirstSyncMix10k(b *testing.B) { benchmarkFirstSync(b, shape{10000, 10, true}, Options{}) }

// BenchmarkFirstSyncMix100k is a start with 100k services × 10 endpoints
// of the types hack/bench runs.
func BenchmarkFirstSyncMix100k(b *testing.B) {
	benchmarkFirstSync(b, shape{100000, 10, true}, Options{})
}

// BenchmarkFirstSync5kx50 is a start with 5k services × 50 endpoints.
func BenchmarkFirstSync5kx50(b *testing.B) { benchmarkFirstSync(b, shape{5000, 50, false}, Options{}) }

// BenchmarkFirstSync1x5000 is a start with one service of 5000 endpoints.
func BenchmarkFirstSync1x5000(b *testing.B) { benchmarkFirstSync(b, shape{1, 5000, false}, Options{}) }

// benchmarkFullSync times full syncs that refill every object of a shape,
// as after another process's commit, or hourly.
func benchmarkFullSync(b *testing.B, s shape, opts Options) {
	be := openBenchBackend(b, opts)
	b.Cleanup(func() { be.Close() })
	p := shapePlan(s)
	m := startMeasure(b, p)
	for range b.N {
		be.refilled = time.Time{}
		m.op(func() { mustSyncBench(b, be, p, backends.FullSync()) })
	}
	m.report()
}

// BenchmarkFullSync1k refills the whole table holding 1k services × 10 endpoints.
func BenchmarkFullSync1k(b *testing.B) { benchmarkFullSync(b, shape{1000, 10, false}, Options{}) }

// BenchmarkFullSync10k refills the whole table holding 10k services × 10 endpoints.
func BenchmarkFullSync10k(b *testing.B) { benchmarkFullSync(b, shape{10000, 10, false}, Options{}) }

// BenchmarkFullSync10kPlainBuckets is BenchmarkFullSync10k with
// Options.PlainBuckets: what the comments on buckets cost.
func BenchmarkFullSync10kPlainBuckets(b *testing.B) {
	benchmarkFullSync(b, shape{10000, 10, false}, Options{PlainBuckets: true})
}

// BenchmarkFullSync100k refills the whole table holding 100k services × 10 endpoints.
func BenchmarkFullSync100k(b *testing.B) { benchmarkFullSync(b, shape{100000, 10, false}, Options{}) }

// BenchmarkQuietFullSync10k is the periodic full sync of 10k services when
// nothing committed since Weir's last commit: the generation vouches for
// the tables, nothing is written.
func BenchmarkQuietFullSync10k(b *testing.B) {
	be, p, _ := synced(b, shape{10000, 10, false})
	m := startMeasure(b, p)
	for range b.N {
		m.op(func() { mustSyncBench(b, be, p, backends.FullSync()) })
	}
	m.report()
}

// synced returns a backend holding a shape and the key of one of its
// services, from the middle.
func synced(b *testing.B, s shape) (*Backend, *plan.Plan, plan.Key) {
	be := newBenchBackend(b)
	p := shapePlan(s)
	mustSyncBench(b, be, p, backends.FullSync())
	keys := p.Keys()
	return be, p, keys[len(keys)/2]
}

// benchmarkOneEndpointChange replaces one endpoint of one service.
func benchmarkOneEndpointChange(b *testing.B, s shape) {
	be, p, key := synced(b, s)
	m := startMeasure(b, p)
	for i := range b.N {
		svc := p.Services[key].Clone()
		svc.Endpoints[3].Address = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		p.Services[key] = svc
		m.op(func() { mustSyncBench(b, be, p, backends.PartialSync(key)) })
	}
	m.report()
}

// BenchmarkOneEndpointChange10k replaces one endpoint of one service among 10k.
func BenchmarkOneEndpointChange10k(b *testing.B) {
	benchmarkOneEndpointChange(b, shape{10000, 10, false})
}

// BenchmarkOneEndpointChange100k replaces one endpoint of one service among 100k.
func BenchmarkOneEndpointChange100k(b *testing.B) {
	benchmarkOneEndpointChange(b, shape{100000, 10, false})
}

// BenchmarkOneEndpointChange5kx50 replaces one endpoint of one service
// among 5k of 50 endpoints each.
func BenchmarkOneEndpointChange5kx50(b *testing.B) {
	benchmarkOneEndpointChange(b, shape{5000, 50, false})
}

// BenchmarkOneEndpointChange1x5000 replaces one endpoint of a service of
// 5000.
func BenchmarkOneEndpointChange1x5000(b *testing.B) {
	benchmarkOneEndpointChange(b, shape{1, 5000, false})
}

// BenchmarkScaleDown10k removes one endpoint of a service among 10k, which
// moves it to another pick chain.
func BenchmarkScaleDown10k(b *testing.B) {
	be, p, key := synced(b, shape{10000, 10, false})
	full := p.Services[key]
	m := startMeasure(b, p)
	for i := range b.N {
		s := full.Clone()
		if i%2 == 0 {
			s.Endpoints = s.Endpoints[:9]
		}
		p.Services[key] = s
		m.op(func() { mustSyncBench(b, be, p, backends.PartialSync(key)) })
	}
	m.report()
}

// benchmarkReadBack reads back the tables holding n services × 10
// endpoints and rebuilds their View: what weir diagnose and the soak
// checker pay per check.
func benchmarkReadBack(b *testing.B, n int) {
	be, p, _ := synced(b, shape{n, 10, false})
	ctx := context.Background()
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
// endpoints, every one with ClientIP affinity: a chain per service and
// kind, two rules per endpoint.
func BenchmarkFullSyncSticky1k(b *testing.B) {
	be := newBenchBackend(b)
	p := benchkit.Plan(1000, 10, 1)
	for _, s := range p.Services {
		s.Affinity = &plan.Affinity{TimeoutSeconds: 10800}
	}
	m := startMeasure(b, p)
	for range b.N {
		be.refilled = time.Time{}
		m.op(func() { mustSyncBench(b, be, p, backends.FullSync()) })
	}
	m.report()
}
