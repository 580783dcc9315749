package hooks

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// benchChain returns the chain the Apply benchmarks run: one well-behaved
// plugin, or three. A full batch of 10k services takes longer than the
// default timeout (WithCloseOnContextDone makes every loop iteration and
// function entry of the guest call into the host), so they get 10 s.
func benchChain(n int) []Config {
	plugins := []Config{reweight("reweight", "w"), {Name: "noop", Path: guest("noop")}, reweight("reweight2", "w2")}
	for i := range plugins {
		plugins[i].Timeout = 10 * time.Second
	}
	if n == 1 {
		return plugins[:1]
	}
	return plugins
}

// benchServices returns n services of 10 endpoints each, annotated for the
// reweight plugins.
func benchServices(n int) ([]*plan.Service, []plan.Key) {
	services := make([]*plan.Service, n)
	keys := make([]plan.Key, n)
	for i := range services {
		services[i] = svc(fmt.Sprintf("ns-%d", i%50), fmt.Sprintf("svc-%d", i), 10, "w", "3", "w2", "5")
		keys[i] = services[i].Key
	}
	return services, keys
}

// BenchmarkApply measures a full Apply of 10k services x 10 endpoints with
// a cold cache (every service goes through every plugin), a partial Apply
// of one changed service (a sync after one EndpointSlice change) and a full
// Apply in which one service changed (a periodic full sync).
func BenchmarkApply(b *testing.B) {
	services, keys := benchServices(10000)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("plugins=%d/full-cold", n), func(b *testing.B) {
			c, _ := newChain(b, Options{}, benchChain(n)...)
			b.ReportAllocs()
			for b.Loop() {
				c.Forget(keys...)
				if _, err := c.Apply(context.Background(), node, services, true); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("plugins=%d/one-change-partial", n), func(b *testing.B) {
			c, _ := newChain(b, Options{}, benchChain(n)...)
			if _, err := c.Apply(context.Background(), node, services, true); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := i % len(services)
				one := []*plan.Service{with(services[k], "w", strconv.Itoa(4+i%2))}
				i++
				if _, err := c.Apply(context.Background(), node, one, false); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("plugins=%d/one-change-full", n), func(b *testing.B) {
			c, _ := newChain(b, Options{}, benchChain(n)...)
			in := append([]*plan.Service(nil), services...)
			if _, err := c.Apply(context.Background(), node, in, true); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := i % len(in)
				in[k] = with(services[k], "w", strconv.Itoa(4+i%2))
				i++
				if _, err := c.Apply(context.Background(), node, in, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad measures loading a plugin whose compiled code is in the
// on-disk cache, alone and configured four times (the entries share one
// compiled module).
func BenchmarkLoad(b *testing.B) {
	b.Run("one", func(b *testing.B) { benchLoad(b, reweight("reweight", "w")) })
	b.Run("four-of-one-file", func(b *testing.B) {
		benchLoad(b, reweight("a", "w"), reweight("b", "w"), reweight("c", "w"), reweight("d", "w"))
	})
}

// benchLoad measures New and Close of a chain of cfgs, after a warm-up.
func benchLoad(b *testing.B, cfgs ...Config) {
	log, _ := testLog(b)
	opts := Options{CacheDir: cacheDir, Log: log}
	warm, err := New(context.Background(), cfgs, opts)
	if err != nil {
		b.Fatal(err)
	}
	_ = warm.Close(context.Background())
	for b.Loop() {
		c, err := New(context.Background(), cfgs, opts)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close(context.Background())
	}
}

// BenchmarkApplyExamples measures a restart's first full sync through the
// example plugins hack/bench --plugins runs (drain of node-2, which drops a
// third of the endpoints, zone-preference and affinity, which change
// nothing) on hack/bench's plan: 10k services × 10 endpoints on three
// nodes, no zones. Each Apply runs on a chain just loaded; besides the
// wall time it reports the CPU time the process spent in the Apply, which
// varies less on a loaded machine.
func BenchmarkApplyExamples(b *testing.B) {
	services := spreadServices(10000, 10)
	cfgs := []Config{
		{Name: "drain", Path: guest("drain"), Config: map[string]any{"nodes": []any{"node-2"}}},
		{Name: "zone-preference", Path: guest("zone-preference")},
		{Name: "affinity", Path: guest("affinity")},
	}
	for i := range cfgs {
		cfgs[i].Timeout = 10 * time.Second
	}
	log, _ := testLog(b)
	var cpu time.Duration
	var faults int64
	for b.Loop() {
		b.StopTimer()
		c, err := New(context.Background(), cfgs, Options{CacheDir: cacheDir, Log: log})
		if err != nil {
			b.Fatal(err)
		}
		before := cpuTime(b)
		f0 := minflt()
		b.StartTimer()
		if _, err := c.Apply(context.Background(), plan.Node{Name: "node-0"}, services, true); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += cpuTime(b) - before
		faults += minflt() - f0
		_ = c.Close(context.Background())
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(faults)/float64(b.N), "faults/op")
}

func minflt() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

// spreadServices returns n services of eps endpoints each, as hack/bench
// generates them: endpoint j of each service runs on node-(j%3).
func spreadServices(n, eps int) []*plan.Service {
	out := make([]*plan.Service, n)
	for i := range out {
		s := sdktest.Service("bench", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.%d.%d.%d", 96+i>>16, (i>>8)&255, i&255), 80)
		for j := range eps {
			addr := netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte((i&15)<<4 + j)})
			s.Endpoints = append(s.Endpoints, sdktest.Endpoint(addr.String(), 8080, fmt.Sprintf("node-%d", j%3), "",
				fmt.Sprintf("svc-%d-%d", i, j)))
		}
		out[i] = s
	}
	return out
}

// cpuTime returns the CPU time, user and system, the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
