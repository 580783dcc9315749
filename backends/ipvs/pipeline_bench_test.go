//go:build vm

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/benchkit"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// BenchmarkIPVSOps10k isolates the IPVS part of BenchmarkSync10k: 10k
// virtual servers × 10 real servers added and read back, each run in a
// fresh namespace after a sync of one service (the kernel refuses real
// servers while the namespace has no local routing table). "pipelined"
// applies them through genlConn (apply-s), reads them back through it
// (read-s) and again through github.com/moby/ipvs (moby-read-s); its
// ns/op counts all three. "one-by-one" applies them one round trip each
// through github.com/moby/ipvs, as before the pipelined client.
func BenchmarkIPVSOps10k(b *testing.B) {
	var ops []op
	for i := range 10000 {
		k := vsKey{addr: netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}), proto: plan.TCP, port: 80}
		ops = append(ops, op{kind: opAddVS, key: k, vs: newVirtualServer("rr", 0)})
		for j := range 10 {
			a := netip.AddrFrom4([4]byte{10, 244, byte(i >> 4), byte(i<<4 + j + 1)})
			ops = append(ops, op{kind: opAddRS, key: k, real: netip.AddrPortFrom(a, 8080), weight: 1})
		}
	}
	run := func(b *testing.B, pipelined bool) {
		for range b.N {
			b.StopTimer()
			be, err := New(Options{Common: backends.Common{NetNS: netns.Empty(b, b)}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { be.Close() })
			if err := be.Sync(context.Background(), benchkit.Plan(1, 1, 1), backends.FullSync()); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			read, err := be.loadOps(ops, pipelined)
			if err != nil {
				b.Fatal(err)
			}
			if pipelined {
				b.ReportMetric(read[2].Seconds(), "apply-s")
				b.ReportMetric(read[0].Seconds(), "read-s")
				b.ReportMetric(read[1].Seconds(), "moby-read-s")
			}
		}
	}
	b.Run("pipelined", func(b *testing.B) { run(b, true) })
	b.Run("one-by-one", func(b *testing.B) { run(b, false) })
}

// loadOps applies ops under the backend's lock and, when pipelined,
// reads everything back through genlConn and then through
// github.com/moby/ipvs, returning how long each read and the apply took.
func (be *Backend) loadOps(ops []op, pipelined bool) ([3]time.Duration, error) {
	var took [3]time.Duration
	be.mu.Lock()
	defer be.mu.Unlock()
	if !pipelined {
		for _, o := range ops {
			if err := apply(be.ipvs, be.programmed, o, time.Now()); err != nil {
				return took, err
			}
		}
		return took, nil
	}
	start := time.Now()
	if err := applyBatch(be.genl, be.programmed, ops, start); err != nil {
		return took, err
	}
	took[2] = time.Since(start)
	start = time.Now()
	got, err := readKernel(be.genl, func(vsKey) bool { return true })
	if err == nil && len(got) != 10001 {
		err = fmt.Errorf("read back %d virtual servers", len(got))
	}
	took[0] = time.Since(start)
	if err != nil {
		return took, err
	}
	start = time.Now()
	svcs, err := be.ipvs.GetServices()
	for _, s := range svcs {
		if err != nil {
			break
		}
		_, err = be.ipvs.GetDestinations(s)
	}
	took[1] = time.Since(start)
	return took, err
}

// The one-round-trip-per-op baseline the benchmark compares with:
// github.com/moby/ipvs, as the backend used it before the pipelined client.

// apply sends one op to the kernel and, when it succeeded, records it in
// programmed. Adding what exists updates it; deleting what is gone is
// not an error, so a memory that drifted from the kernel converges.
func apply(c ipvsConn, programmed map[vsKey]*virtualServer, o op, now time.Time) error {
	if err := send(c, programmed[o.key], o); err != nil {
		return err
	}
	record(programmed, o, now)
	return nil
}

// send performs one op over netlink; cur is the programmed virtual server
// (nil for opAddVS).
func send(c ipvsConn, cur *virtualServer, o op) error {
	var err error
	svc := toService(o.key, cur)
	dst := toDestination(o.real, o.weight)
	switch o.kind {
	case opAddVS:
		svc = toService(o.key, o.vs)
		if err = c.NewService(svc); errors.Is(err, unix.EEXIST) {
			err = c.UpdateService(svc)
		}
	case opUpdateVS:
		err = c.UpdateService(toService(o.key, o.vs))
	case opDelVS:
		err = ignoreGone(c.DelService(svc))
	case opAddRS:
		if err = c.NewDestination(svc, dst); errors.Is(err, unix.EEXIST) {
			err = c.UpdateDestination(svc, dst)
		}
	case opUpdateRS, opDrainRS:
		err = c.UpdateDestination(svc, dst)
	case opDelRS:
		err = ignoreGone(c.DelDestination(svc, dst))
	}
	if err != nil {
		return fmt.Errorf("ipvs: %s: %w", o, err)
	}
	return nil
}
