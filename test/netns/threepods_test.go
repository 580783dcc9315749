package netns

import (
	"net/netip"
	"slices"
	"testing"
)

func TestThreePodsSpecs(t *testing.T) {
	specs := ThreePods()
	want := []PodSpec{
		{Name: "pod-a", IP: PodA, Ports: []uint16{PodPort}},
		{Name: "pod-b", IP: PodB, Ports: []uint16{PodPort}},
		{Name: "pod-c", IP: PodC, Ports: []uint16{PodPort}},
	}
	if !slices.EqualFunc(specs, want, equalSpec) {
		t.Errorf("ThreePods() = %v, want %v", specs, want)
	}
	specs = ThreePods(DualStack("pod-a", "pod-c"), ServePorts(80, 53))
	want = []PodSpec{
		{Name: "pod-a", IP: PodA, IP6: PodA6, Ports: []uint16{80, 53}},
		{Name: "pod-b", IP: PodB, Ports: []uint16{80, 53}},
		{Name: "pod-c", IP: PodC, IP6: PodC6, Ports: []uint16{80, 53}},
	}
	if !slices.EqualFunc(specs, want, equalSpec) {
		t.Errorf("with options: %v, want %v", specs, want)
	}
}

func equalSpec(a, b PodSpec) bool {
	return a.Name == b.Name && a.IP == b.IP && a.IP6 == b.IP6 && slices.Equal(a.Ports, b.Ports)
}

func TestThreePodsRejectsOtherNames(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("DualStack(\"pod-d\") did not panic")
		}
	}()
	ThreePods(DualStack("pod-d"))
}

// TestNewThreePods reaches every pod at its addresses and ports from the
// client; only the pod DualStack names has IPv6.
func TestNewThreePods(t *testing.T) {
	topo := NewThreePods(t, DualStack("pod-b"), ServePorts(80, 53))
	reach := map[string][]netip.Addr{"pod-a": {PodA}, "pod-b": {PodB, PodB6}, "pod-c": {PodC}}
	for name, addrs := range reach {
		p := topo.Pods[name]
		if p == nil {
			t.Fatalf("no pod %s in %v", name, topo.Pods)
		}
		if got := p.IP6.IsValid(); got != (len(addrs) == 2) {
			t.Errorf("pod %s: IPv6 %v, want it only on pod-b", name, p.IP6)
		}
		for _, a := range addrs {
			for _, port := range []uint16{80, 53} {
				to := netip.AddrPortFrom(a, port)
				if got := dial(t, topo.Client, to); got.Pod != name {
					t.Errorf("tcp to %s: answered by %s, want %s", to, got.Pod, name)
				}
				if got, err := topo.Client.AskUDP(probeCtx(t), to); err != nil || got.Pod != name {
					t.Errorf("udp to %s: %v, %v; want %s", to, got, err, name)
				}
			}
		}
	}
}
