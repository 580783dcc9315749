package iptables

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
)

var renderBenchOptions = &Options{Common: backends.Common{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")}}}

// BenchmarkRenderFull10k renders 10k services × 10 endpoints in full; it
// reports the restore text size and the heap the written state keeps.
func BenchmarkRenderFull10k(b *testing.B) {
	p := benchkit.Plan(10000, 10, 10)
	state := writtenMB(p)
	var r restore
	for b.Loop() {
		r, _ = renderFull(ipv4, p, renderBenchOptions, nil)
	}
	b.ReportMetric(float64(len(r.NAT)+len(r.Filter))/1e6, "text-MB")
	b.ReportMetric(state, "state-MB")
}

// writtenMB returns the heap a full render's written state of p keeps.
func writtenMB(p *plan.Plan) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, w := renderFull(ipv4, p, renderBenchOptions, nil)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(w)
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / 1e6
}

// BenchmarkRenderPartial10k renders one changed endpoint of one service of
// 10k × 10, each iteration on top of the previous one's state.
func BenchmarkRenderPartial10k(b *testing.B) {
	p := benchkit.Plan(10000, 10, 10)
	_, prev := renderFull(ipv4, p, renderBenchOptions, nil)
	keys := p.Keys()
	i := 0
	for b.Loop() {
		k := keys[(i*7919)%len(keys)]
		s := p.Services[k].Clone()
		s.Endpoints[i%10].Address = s.Endpoints[i%10].Address.Next()
		p.Services[k] = s
		var r restore
		r, prev = renderPartial(ipv4, p, []plan.Key{k}, prev, renderBenchOptions)
		if r.NAT == nil {
			b.Fatal("no change rendered")
		}
		i++
	}
}
