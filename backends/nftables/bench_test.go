package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// benchNamespace creates an empty network namespace for the benchmark and
// removes it when the benchmark ends.
func benchNamespace(b *testing.B) netns.NsHandle {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates a network namespace")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	defer orig.Close()
	name := fmt.Sprintf("weir-bench-%d", os.Getpid())
	ns, err := netns.NewNamed(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Close(); netns.DeleteNamed(name) })
	return ns
}

// scalePlan returns n services with eps endpoints each, every one a NodePort
// service so both maps are exercised.
func scalePlan(n, eps int) *plan.Plan {
	p := &plan.Plan{Services: make(map[plan.Key]*plan.Service, n)}
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
			NodePort:   uint16(30000 + i%2700),
		}
		if i >= 2700 {
			s.NodePort = 0
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

func benchmarkFullSync(b *testing.B, n int) {
	ns := benchNamespace(b)
	be, err := New(Options{Common: backends.Common{NetNS: int(ns)}})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	p := scalePlan(n, 10)
	b.ResetTimer()
	for range b.N {
		if err := be.Sync(context.Background(), p, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFullSync1k replaces the whole table holding 1k services × 10 endpoints.
func BenchmarkFullSync1k(b *testing.B) { benchmarkFullSync(b, 1000) }

// BenchmarkFullSync10k replaces the whole table holding 10k services × 10 endpoints.
func BenchmarkFullSync10k(b *testing.B) { benchmarkFullSync(b, 10000) }

// syncedScale returns a backend holding 10k services × 10 endpoints and the
// key of one of them.
func syncedScale(b *testing.B) (*Backend, *plan.Plan, plan.Key) {
	ns := benchNamespace(b)
	be, err := New(Options{Common: backends.Common{NetNS: int(ns)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	p := scalePlan(10000, 10)
	if err := be.Sync(context.Background(), p, nil); err != nil {
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
		if err := be.Sync(ctx, p, []plan.Key{key}); err != nil {
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
		if err := be.Sync(ctx, p, []plan.Key{key}); err != nil {
			b.Fatal(err)
		}
	}
}
