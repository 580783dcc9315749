package iptables

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// renderBenchPlan returns n services with eps endpoints each; every tenth
// has a node port.
func renderBenchPlan(n, eps int) *plan.Plan {
	p := &plan.Plan{Services: make(map[plan.Key]*plan.Service, n)}
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
		}
		if i%10 == 0 {
			s.NodePort = uint16(30000 + i/10)
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

var renderBenchOptions = &Options{Common: backends.Common{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")}}}

// BenchmarkRenderFull10k renders 10k services × 10 endpoints in full; it
// reports the restore text size and the heap the written state keeps.
func BenchmarkRenderFull10k(b *testing.B) {
	p := renderBenchPlan(10000, 10)
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
	p := renderBenchPlan(10000, 10)
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
