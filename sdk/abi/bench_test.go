package abi

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

// benchServices is a cluster of n services with 10 endpoints each spread
// over 100 nodes in 3 zones.
func benchServices(n int) []*plan.Service {
	out := make([]*plan.Service, n)
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = "node-" + strconv.Itoa(i)
	}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for i := range out {
		name := "svc-" + strconv.Itoa(i)
		s := &plan.Service{
			Key:        plan.Key{Namespace: "ns-" + strconv.Itoa(i%50), Name: name, Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Port:       80,
			Labels:     map[string]string{"app": name, "team": "t" + strconv.Itoa(i%20)},
			Endpoints:  make([]plan.Endpoint, 10),
		}
		for j := range s.Endpoints {
			k := i*10 + j
			s.Endpoints[j] = plan.Endpoint{
				Address: netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}), Port: 8080,
				NodeName: nodes[k%100], Zone: zones[k%3], Pod: name + "-" + strconv.Itoa(j),
				Ready: true, Serving: true, ForCluster: true, Weight: 1,
			}
		}
		out[i] = s
	}
	return out
}

func BenchmarkEncode(b *testing.B) {
	in := benchServices(10000)
	var e Encoder
	e.Encode(testNode, in, true)
	b.ReportAllocs()
	for b.Loop() {
		e.Encode(testNode, in, true)
	}
}

func BenchmarkDecodeUnchanged(b *testing.B) {
	in := benchServices(10000)
	var e Encoder
	buf := e.Encode(testNode, in, true)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(in, buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeReweighted(b *testing.B) {
	in := benchServices(10000)
	var e Encoder
	buf := e.Encode(testNode, in, true)
	batch, err := Parse(buf)
	if err != nil {
		b.Fatal(err)
	}
	for i := range batch.Len() {
		batch.Service(i).Endpoint(0).SetWeight(5)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(in, buf); err != nil {
			b.Fatal(err)
		}
	}
}
