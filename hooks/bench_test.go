package hooks

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
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
