package difftest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/test/netns"
)

// Probe is one place dialling one address, the same in every run.
type Probe struct {
	// ID names the probe in reports: "svc-03:http TCP client -> 10.96.4.13:80".
	ID string
	// Service is the service port the address belongs to ("svc-03:http"),
	// or "" for an address of no service.
	Service string
	// From is client, node, or a pod's name.
	From string
	// To is the address dialled.
	To netip.AddrPort
	// Proto is TCP, UDP, or HTTP (a GET of a health-check node port).
	Proto string
	// Candidates are the pods that could answer: every address of the
	// service's slices. A probe stops early once each has answered.
	Candidates []string
	// Sticky is set for services with ClientIP affinity: every answer
	// must come from one pod, whichever.
	Sticky bool
}

// Addresses that are the node's own besides its NodePort address:
// loopback, and the link-local gateway of every pod's veth.
var (
	loopback = netip.MustParseAddr("127.0.0.1")
	gateway  = netns.PodGateway
)

// probeSources are the places every service address is dialled from.
var probeSources = []string{"client", "node", "pod-a", "pod-b", "pod-c"}

// Probes returns the scenario's probes: every address of every service
// port (cluster IP, external and load-balancer IPs, the node port on the
// node's address) from the client, the node and each pod; the node port
// also on 127.0.0.1 from the node and on the pods' gateway from a pod; a
// port the cluster IP does not serve; each health-check node port; and an
// address of the service range no service has.
func Probes(sc *Scenario) []Probe {
	var out []Probe
	for _, svc := range sc.Services {
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		cands := candidates(sc, svc)
		sticky := svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
		for _, sp := range svc.Spec.Ports {
			name := svc.Name + ":" + cmp.Or(sp.Name, fmt.Sprint(sp.Port))
			base := Probe{Service: name, Proto: string(sp.Protocol), Candidates: cands, Sticky: sticky}
			for _, a := range serviceAddrs(svc) {
				out = appendFrom(out, base, netip.AddrPortFrom(a, uint16(sp.Port)), probeSources...)
			}
			if sp.NodePort != 0 {
				np := uint16(sp.NodePort)
				out = appendFrom(out, base, netip.AddrPortFrom(nodeIP, np), probeSources...)
				out = appendFrom(out, base, netip.AddrPortFrom(loopback, np), "node")
				out = appendFrom(out, base, netip.AddrPortFrom(gateway, np), "pod-a")
			}
		}
		ip := netip.MustParseAddr(svc.Spec.ClusterIP)
		out = appendFrom(out, Probe{Service: svc.Name + ":9", Proto: "TCP"}, netip.AddrPortFrom(ip, 9), "client", "node")
		if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
			out = appendFrom(out, Probe{Service: svc.Name + " health", Proto: "HTTP"},
				netip.AddrPortFrom(nodeIP, uint16(hc)), "client")
		}
	}
	unused := netip.MustParseAddrPort(fmt.Sprintf("10.96.%d.250:80", 1+int(uint64(sc.Seed)%50)))
	return appendFrom(out, Probe{Proto: "TCP"}, unused, "client", "node", "pod-a")
}

// appendFrom appends base dialling to from each source.
func appendFrom(out []Probe, base Probe, to netip.AddrPort, from ...string) []Probe {
	for _, f := range from {
		p := base
		p.From, p.To = f, to
		p.ID = fmt.Sprintf("%s %s %s -> %s", cmp.Or(p.Service, "no service"), p.Proto, f, to)
		out = append(out, p)
	}
	return out
}

// serviceAddrs returns the cluster IP, external IPs and load-balancer
// ingress IPs of a service.
func serviceAddrs(svc *corev1.Service) []netip.Addr {
	addrs := []netip.Addr{netip.MustParseAddr(svc.Spec.ClusterIP)}
	for _, a := range svc.Spec.ExternalIPs {
		addrs = append(addrs, netip.MustParseAddr(a))
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		addrs = append(addrs, netip.MustParseAddr(ing.IP))
	}
	return addrs
}

// candidates returns the pods named by any of the service's slices.
func candidates(sc *Scenario, svc *corev1.Service) []string {
	var out []string
	for _, sl := range sc.slicesOf(svc.Name) {
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				if p := podOf(a); p != "" && !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
