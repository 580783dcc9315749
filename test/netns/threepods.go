package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// The addresses of the pods ThreePods describes. The IPv6 ones are used
// only for the pods DualStack names.
var (
	// PodA is pod-a's IPv4 address.
	PodA = netip.MustParseAddr("10.244.0.11")
	// PodB is pod-b's IPv4 address.
	PodB = netip.MustParseAddr("10.244.0.12")
	// PodC is pod-c's IPv4 address.
	PodC = netip.MustParseAddr("10.244.0.13")
	// PodA6 is pod-a's IPv6 address.
	PodA6 = netip.MustParseAddr("fd00:10:244::11")
	// PodB6 is pod-b's IPv6 address.
	PodB6 = netip.MustParseAddr("fd00:10:244::12")
	// PodC6 is pod-c's IPv6 address.
	PodC6 = netip.MustParseAddr("fd00:10:244::13")
)

// PodPort is the port the pods of ThreePods serve unless ServePorts says
// otherwise.
const PodPort = 8080

// PodOption varies the pods ThreePods describes.
type PodOption func(*podOptions)

type podOptions struct {
	dual  []string
	ports []uint16
}

// DualStack gives the named pods their IPv6 addresses; the others stay
// IPv4-only.
func DualStack(names ...string) PodOption {
	return func(o *podOptions) { o.dual = append(o.dual, names...) }
}

// ServePorts makes every pod serve ports, over TCP and UDP, instead of
// PodPort.
func ServePorts(ports ...uint16) PodOption {
	return func(o *podOptions) { o.ports = ports }
}

// ThreePods returns the specs of the kernel tests' usual pods: pod-a,
// pod-b and pod-c at PodA, PodB and PodC, each serving PodPort. It panics
// if DualStack names another pod.
func ThreePods(opts ...PodOption) []PodSpec {
	o := podOptions{ports: []uint16{PodPort}}
	for _, opt := range opts {
		opt(&o)
	}
	specs := []PodSpec{{Name: "pod-a", IP: PodA}, {Name: "pod-b", IP: PodB}, {Name: "pod-c", IP: PodC}}
	ip6 := []netip.Addr{PodA6, PodB6, PodC6}
	for i := range specs {
		specs[i].Ports = slices.Clone(o.ports)
		if slices.Contains(o.dual, specs[i].Name) {
			specs[i].IP6 = ip6[i]
		}
	}
	for _, name := range o.dual {
		if !slices.ContainsFunc(specs, func(s PodSpec) bool { return s.Name == name }) {
			panic(fmt.Sprintf("netns: DualStack(%q): ThreePods has pod-a, pod-b and pod-c", name))
		}
	}
	return specs
}

// NewThreePods builds, with NewT, a topology of the pods ThreePods
// returns for opts.
func NewThreePods(t testing.TB, opts ...PodOption) *Topology {
	t.Helper()
	return NewT(t, Options{Pods: ThreePods(opts...)})
}
