//go:build vm

package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// signalWatch reads the signals of services through a backend and keeps,
// per service and endpoint, the sum of every New read so far.
type signalWatch struct {
	t        *testing.T
	b        *Backend
	services []*plan.Service
	last     [][]abi.Signals
	newSum   [][]uint64
}

func newSignalWatch(t *testing.T, b *Backend, services ...*plan.Service) *signalWatch {
	w := &signalWatch{t: t, b: b, services: services}
	for _, s := range services {
		w.newSum = append(w.newSum, make([]uint64, len(s.Endpoints)))
	}
	return w
}

// read reads the signals once and adds their New to the sums.
func (w *signalWatch) read() {
	w.t.Helper()
	got, err := w.b.Signals(context.Background(), w.services)
	if err != nil {
		w.t.Fatalf("signals: %v", err)
	}
	if len(got) != len(w.services) {
		w.t.Fatalf("signals for %d services, want %d", len(got), len(w.services))
	}
	for i, s := range w.services {
		if len(got[i]) != len(s.Endpoints) {
			w.t.Fatalf("%s: signals for %d endpoints, want %d", s.Key, len(got[i]), len(s.Endpoints))
		}
		for j, sig := range got[i] {
			w.newSum[i][j] += uint64(sig.New)
		}
	}
	w.last = got
}

// await reads until, for every service and endpoint, Active is active
// and the New read so far add up to opened, or fails after a deadline
// (the kernel refreshes the count behind New every two seconds). A sum
// of New beyond opened fails at once: a connection was counted twice.
func (w *signalWatch) await(what string, active, opened [][]uint32) {
	w.t.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for n := 1; ; n++ {
		w.read()
		done := true
		for i, s := range w.services {
			for j := range s.Endpoints {
				if w.newSum[i][j] > uint64(opened[i][j]) {
					w.t.Fatalf("%s: %s endpoint %d: New adds up to %d, more than the %d connections opened",
						what, s.Key, j, w.newSum[i][j], opened[i][j])
				}
				done = done && w.last[i][j].Active == active[i][j] && w.newSum[i][j] == uint64(opened[i][j])
			}
		}
		if done {
			w.t.Logf("%s: signals right after %d readings, %s", what, n, time.Since(start).Round(10*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: after 30 s, signals %v with New adding up to %v; want Active %v and New adding up to %v",
				what, w.last, w.newSum, active, opened)
		}
		time.Sleep(250 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestKernelSignalsFollowHeldConnections syncs a TCP service with three
// endpoints on a cluster IP and a node port, and a UDP one, holds real
// connections open through both TCP virtual servers, and checks that each
// endpoint's Active is the connections it holds and its New, summed over
// the readings, the connections it was sent, counted once; that closing
// connections lowers Active without adding New; and that UDP flows count
// as active.
func TestKernelSignalsFollowHeldConnections(t *testing.T) {
	topo, b := newCluster(t, Options{})
	const port, nodePort = 9100, 30910
	holdServer(t, topo, port, "pod-a", "pod-b", "pod-c")
	web := service("sig", plan.TCP, port, nodePort, []string{vip.String()},
		ep(podA.String(), port, 1), ep(podB.String(), port, 1), ep(podC.String(), port, 1))
	dns := service("sig-dns", plan.UDP, 53, 0, []string{vip.String()}, podEP(podA, 1), podEP(podB, 1), podEP(podC, 1))
	mustSync(t, b, testPlan(web, dns), backends.FullSync())

	// The services as a plugin saw them, endpoints in another order, and
	// one never synced: the signals follow the order asked.
	asked := web.Clone()
	slices.Reverse(asked.Endpoints)
	at := map[string]int{"pod-c": 0, "pod-b": 1, "pod-a": 2}
	unsynced := service("nowhere", plan.TCP, 80, 0, []string{"10.96.0.99"}, podEP(podA, 1))
	w := newSignalWatch(t, b, asked, dns, unsynced)
	w.read()
	for i, sig := range w.last {
		if slices.ContainsFunc(sig, func(s abi.Signals) bool { return s != abi.Signals{} }) {
			t.Fatalf("service %d before any connection: %v", i, sig)
		}
	}

	cluster, node := netip.AddrPortFrom(vip, port), netip.AddrPortFrom(topo.NodeIP, nodePort)
	var held []*holdConn
	var pods []int
	opened := []uint32{0, 0, 0}
	for i := range 7 {
		addr := cluster
		if i >= 5 {
			addr = node
		}
		c := dialHold(t, topo.Client, addr)
		j, ok := at[c.ask(t)]
		if !ok {
			t.Fatalf("connection %d to %s: answered by an unknown pod", i, addr)
		}
		held, pods = append(held, c), append(pods, j)
		opened[j]++
	}
	t.Logf("7 connections held open, per endpoint (c, b, a): %v", opened)

	udpOpened := []uint32{0, 0, 0}
	byName := map[string]int{"pod-a": 0, "pod-b": 1, "pod-c": 2}
	for _, a := range askUDPMany(t, topo.Client, netip.AddrPortFrom(vip, 53), 5) {
		udpOpened[byName[a.Pod]]++
	}
	t.Logf("5 UDP flows, per endpoint (a, b, c): %v", udpOpened)

	none := []uint32{0}
	w.await("connections held", [][]uint32{opened, udpOpened, none}, [][]uint32{opened, udpOpened, none})

	// Reset the cluster-IP connections: Active falls to the node port's,
	// New adds nothing.
	stillOpen := []uint32{0, 0, 0}
	for i, c := range held {
		if i < 5 {
			c.reset()
		} else {
			stillOpen[pods[i]]++
		}
	}
	w.await("cluster-IP connections reset", [][]uint32{stillOpen, udpOpened, none}, [][]uint32{opened, udpOpened, none})
	for _, c := range held[5:] {
		c.reset()
	}
	w.await("every connection reset", [][]uint32{{0, 0, 0}, udpOpened, none}, [][]uint32{opened, udpOpened, none})
	if got := fmt.Sprint(w.last[2]); got != "[{0 0}]" {
		t.Errorf("unsynced service: %s", got)
	}
}
