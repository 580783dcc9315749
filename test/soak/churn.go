package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The annotations the soak's plugins act on.
const (
	canaryAnnotation   = "canary.weir.dev/split"
	affinityAnnotation = "affinity.weir.dev/client-ip"
	hostileAnnotation  = "hostile.weir.dev/act"
)

// churner changes the cluster's objects at random, from a seeded source,
// keeping its model of them.
type churner struct {
	rng  *rand.Rand
	w    store
	pods int
	min  int // services kept at least
	max  int // services at most
	svcs []*service
	// purge holds services whose writes failed: they are deleted, with
	// every slice labelled with their name, as soon as the API allows.
	purge []*service
	seq   int // numbers names, external and load-balancer IPs
	ops   map[string]int
	fails int
	logf  func(format string, args ...any)
}

// op is one kind of change with its relative weight.
type op struct {
	name   string
	weight int
	run    func(ch *churner, ctx context.Context) (*service, error)
}

var ops = []op{
	{"create service", 8, (*churner).create},
	{"delete service", 6, (*churner).delete},
	{"endpoint state", 30, (*churner).flap},
	{"slice split", 5, (*churner).split},
	{"slice merge", 5, (*churner).merge},
	{"ports", 6, (*churner).changePorts},
	{"type", 8, (*churner).changeType},
	{"traffic policy", 6, (*churner).changePolicy},
	{"affinity", 5, (*churner).changeAffinity},
	{"external IPs", 4, (*churner).changeExternalIPs},
	{"plugin annotations", 6, (*churner).changePluginAnnotations},
}

// step makes one random change; a failed write sends the service to be
// purged, so the model never disagrees with the API for long.
func (ch *churner) step(ctx context.Context) {
	ch.retryPurge(ctx)
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	n := ch.rng.IntN(total)
	for _, o := range ops {
		if n -= o.weight; n < 0 {
			s, err := o.run(ch, ctx)
			if s == nil && err == nil {
				return // nothing to do for this kind now
			}
			ch.ops[o.name]++
			if err != nil {
				ch.fails++
				ch.logf("churn: %s: %v; deleting %s", o.name, err, s.key())
				ch.remove(s)
				ch.purge = append(ch.purge, s)
			}
			return
		}
	}
}

// retryPurge deletes the services whose writes failed, and their slices.
func (ch *churner) retryPurge(ctx context.Context) {
	var left []*service
	for _, s := range ch.purge {
		if err := ch.w.purge(ctx, s); err != nil {
			left = append(left, s)
		}
	}
	ch.purge = left
}

func (ch *churner) remove(s *service) {
	ch.svcs = slices.DeleteFunc(ch.svcs, func(o *service) bool { return o == s })
}

// pick returns a random churned service that is not a conflict's
// claimant, or nil.
func (ch *churner) pick() *service {
	var c []*service
	for _, s := range ch.svcs {
		if !s.conflict {
			c = append(c, s)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[ch.rng.IntN(len(c))]
}

// newService makes a random service of the model, not yet stored.
func (ch *churner) newService() *service {
	ch.seq++
	s := &service{
		ns:          namespaces[ch.rng.IntN(len(namespaces))],
		name:        fmt.Sprintf("svc-%d", ch.seq),
		kind:        []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}[ch.rng.IntN(3)],
		ports:       []svcPort{{name: "http", proto: corev1.ProtocolTCP, port: 80}},
		dual:        ch.rng.IntN(5) == 0,
		itpLocal:    ch.rng.IntN(8) == 0,
		annotations: map[string]string{},
	}
	if s.kind != corev1.ServiceTypeClusterIP {
		s.etpLocal = ch.rng.IntN(4) == 0
	}
	if s.kind == corev1.ServiceTypeLoadBalancer {
		s.lbIP = ch.nextAddr(lbBase)
	}
	if ch.rng.IntN(3) == 0 {
		s.ports = append(s.ports, svcPort{name: "dns", proto: corev1.ProtocolUDP, port: 53})
	}
	if ch.rng.IntN(6) == 0 {
		s.affinity = int32(10 + ch.rng.IntN(10800))
	}
	if ch.rng.IntN(10) == 0 {
		s.victim = victimSlots[ch.rng.IntN(len(victimSlots))].name
		s.annotations[victimAnnotation(s.victim)] = "true"
		s.annotations[hostileAnnotation] = "true"
	}
	ch.setPluginAnnotations(s)
	for _, fam := range s.families() {
		for range 1 + ch.rng.IntN(2) {
			if sl := ch.newSlice(s, fam, 1+ch.rng.IntN(4)); len(sl.eps) > 0 {
				s.slices = append(s.slices, sl)
			}
		}
	}
	return s
}

// newSlice makes a slice of up to n endpoints, mostly ready, on random
// pods that no other slice of s of the family lists: an endpoint in two
// slices with different conditions means different things to different
// proxies (kube-proxy keeps whichever slice it happens to read first).
func (ch *churner) newSlice(s *service, fam, n int) *slice {
	s.nextID++
	sl := &slice{name: fmt.Sprintf("%s-%d", s.name, s.nextID), family: fam}
	free := slices.DeleteFunc(ch.rng.Perm(ch.pods), func(p int) bool { return slices.Contains(s.pods(fam), p) })
	for _, pod := range free[:min(n, len(free))] {
		st := epReady
		if ch.rng.IntN(5) == 0 {
			st = epState(ch.rng.IntN(int(numStates)))
		}
		sl.eps = append(sl.eps, endpoint{pod: pod, state: st, local: ch.rng.IntN(4) != 0})
	}
	return sl
}

// The address ranges load-balancer and external IPs come from: the
// benchmarking range, 2^17 addresses, never reused within a run.
var (
	lbBase       = netip.MustParseAddr("198.18.0.1")
	externalBase = netip.MustParseAddr("198.19.0.1")
)

func (ch *churner) nextAddr(base netip.Addr) netip.Addr {
	ch.seq++
	b := base.As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(ch.seq % 65000)
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

func (ch *churner) create(ctx context.Context) (*service, error) {
	if len(ch.svcs) >= ch.max {
		return nil, nil
	}
	s := ch.newService()
	ch.svcs = append(ch.svcs, s)
	return s, ch.w.createService(ctx, s)
}

func (ch *churner) delete(ctx context.Context) (*service, error) {
	if len(ch.svcs) <= ch.min {
		return nil, nil
	}
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	ch.remove(s)
	if err := ch.w.deleteService(ctx, s); err != nil {
		ch.svcs = append(ch.svcs, s) // step purges it
		return s, err
	}
	return s, nil
}

// flap moves one endpoint to another state, removes it, or adds one.
func (ch *churner) flap(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil || len(s.slices) == 0 {
		return nil, nil
	}
	sl := s.slices[ch.rng.IntN(len(s.slices))]
	switch r := ch.rng.IntN(10); {
	case r < 2 || len(sl.eps) == 0:
		free := slices.DeleteFunc(ch.rng.Perm(ch.pods), func(p int) bool { return slices.Contains(s.pods(sl.family), p) })
		if len(free) == 0 {
			return nil, nil
		}
		sl.eps = append(sl.eps, endpoint{pod: free[0], state: epReady, local: ch.rng.IntN(4) != 0})
	case r < 4:
		i := ch.rng.IntN(len(sl.eps))
		sl.eps = slices.Delete(sl.eps, i, i+1)
	default:
		e := &sl.eps[ch.rng.IntN(len(sl.eps))]
		e.state = (e.state + epState(1+ch.rng.IntN(int(numStates)-1))) % numStates
	}
	return s, ch.w.updateSlice(ctx, s, sl)
}

// split moves half of a slice's endpoints into a new slice: the new one is
// created first, so no endpoint is ever missing from the API.
func (ch *churner) split(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	var sl *slice
	for _, i := range ch.rng.Perm(len(s.slices)) {
		if len(s.slices[i].eps) >= 2 {
			sl = s.slices[i]
			break
		}
	}
	if sl == nil {
		return nil, nil
	}
	s.nextID++
	half := len(sl.eps) / 2
	moved := &slice{name: fmt.Sprintf("%s-%d", s.name, s.nextID), family: sl.family, eps: slices.Clone(sl.eps[:half])}
	s.slices = append(s.slices, moved)
	if err := ch.w.createSlice(ctx, s, moved); err != nil {
		return s, err
	}
	sl.eps = slices.Delete(sl.eps, 0, half)
	return s, ch.w.updateSlice(ctx, s, sl)
}

// merge moves the endpoints of one slice into another of the same family
// and deletes it: the receiving slice is written first.
func (ch *churner) merge(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	for _, i := range ch.rng.Perm(len(s.slices)) {
		for j, other := range s.slices {
			into := s.slices[i]
			if j == i || other.family != into.family {
				continue
			}
			for _, e := range other.eps {
				if !slices.ContainsFunc(into.eps, func(o endpoint) bool { return o.pod == e.pod }) {
					into.eps = append(into.eps, e)
				}
			}
			if err := ch.w.updateSlice(ctx, s, into); err != nil {
				return s, err
			}
			s.slices = slices.Delete(s.slices, j, j+1)
			return s, ch.w.deleteSlice(ctx, s, other)
		}
	}
	return nil, nil
}

// changePorts renumbers the TCP port, or adds or removes the UDP one.
func (ch *churner) changePorts(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	if ch.rng.IntN(2) == 0 {
		s.ports[0].port = 80 + int32(ch.rng.IntN(10))
	} else if len(s.ports) == 2 {
		s.ports = s.ports[:1]
	} else {
		s.ports = append(s.ports, svcPort{name: "dns", proto: corev1.ProtocolUDP, port: 53})
	}
	if err := ch.w.updateService(ctx, s); err != nil {
		return s, err
	}
	for _, sl := range s.slices { // the slices list the service's port names
		if err := ch.w.updateSlice(ctx, s, sl); err != nil {
			return s, err
		}
	}
	return s, nil
}

// changeType moves a service to another of ClusterIP, NodePort and
// LoadBalancer.
func (ch *churner) changeType(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	types := slices.DeleteFunc([]corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort,
		corev1.ServiceTypeLoadBalancer}, func(t corev1.ServiceType) bool { return t == s.kind })
	s.kind = types[ch.rng.IntN(len(types))]
	s.lbIP = netip.Addr{}
	if s.kind == corev1.ServiceTypeLoadBalancer {
		s.lbIP = ch.nextAddr(lbBase)
	}
	if s.kind == corev1.ServiceTypeClusterIP {
		s.etpLocal = false
	}
	return s, ch.w.updateService(ctx, s)
}

func (ch *churner) changePolicy(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	if s.kind != corev1.ServiceTypeClusterIP && ch.rng.IntN(2) == 0 {
		s.etpLocal = !s.etpLocal
	} else {
		s.itpLocal = !s.itpLocal
	}
	return s, ch.w.updateService(ctx, s)
}

func (ch *churner) changeAffinity(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	if s.affinity > 0 {
		s.affinity = 0
	} else {
		s.affinity = int32(10 + ch.rng.IntN(10800))
	}
	return s, ch.w.updateService(ctx, s)
}

func (ch *churner) changeExternalIPs(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	if len(s.externalIPs) > 0 && ch.rng.IntN(2) == 0 {
		s.externalIPs = s.externalIPs[1:]
	} else {
		s.externalIPs = append(s.externalIPs, ch.nextAddr(externalBase))
	}
	return s, ch.w.updateService(ctx, s)
}

// changePluginAnnotations changes what the canary and affinity plugins do
// to a service.
func (ch *churner) changePluginAnnotations(ctx context.Context) (*service, error) {
	s := ch.pick()
	if s == nil {
		return nil, nil
	}
	ch.setPluginAnnotations(s)
	return s, ch.w.updateService(ctx, s)
}

// setPluginAnnotations gives s a random canary split (never 0 or 100, so
// no endpoint is drained by it alone) and affinity annotation, or none.
func (ch *churner) setPluginAnnotations(s *service) {
	delete(s.annotations, canaryAnnotation)
	delete(s.annotations, affinityAnnotation)
	if ch.rng.IntN(3) == 0 {
		s.annotations[canaryAnnotation] = fmt.Sprintf("p%d=%d", ch.rng.IntN(ch.pods), 10+ch.rng.IntN(80))
	}
	switch ch.rng.IntN(6) {
	case 0:
		s.annotations[affinityAnnotation] = fmt.Sprintf("%ds", 10+ch.rng.IntN(3600))
	case 1:
		s.annotations[affinityAnnotation] = "off"
	}
}

// populate creates n services at the start, with a deadline per write.
func (ch *churner) populate(ctx context.Context, n int) error {
	for range n {
		s := ch.newService()
		ch.svcs = append(ch.svcs, s)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := ch.w.createService(wctx, s)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
