package conntrack

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// msgCtNew is IPCTNL_MSG_CT_NEW: message type 0 of the subsystem.
const msgCtNew = unix.NFNL_SUBSYS_CTNETLINK << 8

// BenchmarkLoad reads the load of 10k services x 10 endpoints (every 10th
// with a node port, as the planner gives them) from a table of 10k or
// 100k established TCP entries, 90% of them to the services: one whole
// read per op, as the signals loop would make, after a first read that
// sets the IDs New counts from; the last case stops each read at 25k
// entries. sys-ns/op is the kernel's share (system time of the whole
// process), user-ns/op Go's.
func BenchmarkLoad(b *testing.B) {
	serving := benchServing(10000, 10, 10)
	for _, bc := range []struct{ entries, cap int }{{10000, -1}, {100000, -1}, {100000, 25000}} {
		name := fmt.Sprintf("services=10k/entries=%dk", bc.entries/1000)
		if bc.cap > 0 {
			name += fmt.Sprintf("/cap=%dk", bc.cap/1000)
		}
		b.Run(name, func(b *testing.B) {
			ns := netns.Empty(b, b)
			matching := insertEntries(b, ns, serving, bc.entries)
			c, err := New(ns, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			l := NewLoad(c, Limits{MaxEntries: bc.cap, MaxTime: -1})
			checkLoad(b, l, serving, bc.entries, matching)
			var before, after syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.ResetTimer()
			for b.Loop() {
				if _, err := l.Read(b.Context(), serving); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			ops := float64(b.N)
			b.ReportMetric(float64(after.Stime.Nano()-before.Stime.Nano())/ops, "sys-ns/op")
			b.ReportMetric(float64(after.Utime.Nano()-before.Utime.Nano())/ops, "user-ns/op")
			checkLoad(b, l, serving, bc.entries, matching)
		})
	}
}

// checkLoad fails b unless a read sees the whole table, or exactly its
// limit and says so, and counts every matching entry it saw as active.
func checkLoad(b *testing.B, l *Load, serving []Serving, entries, matching int) {
	b.Helper()
	rep, err := l.Read(b.Context(), serving)
	if err != nil {
		b.Fatal(err)
	}
	active := 0
	for _, d := range rep.Dests {
		for _, e := range d.Endpoints {
			active += e.Active
		}
	}
	if limit := l.limits.MaxEntries; limit > 0 && limit < entries {
		if !rep.Truncated || rep.Examined != limit || active == 0 || active > limit {
			b.Fatalf("limited read: examined %d (truncated %v), %d active; want %d, truncated", rep.Examined, rep.Truncated, active, limit)
		}
		return
	}
	if rep.Examined != entries || rep.Truncated || active != matching {
		b.Fatalf("read examined %d entries (truncated %v), %d active; want %d, %d", rep.Examined, rep.Truncated, active, entries, matching)
	}
}

// benchServing returns the destinations of benchServices.
func benchServing(n, eps, nodePortEvery int) []Serving {
	var out []Serving
	for _, s := range benchServices(n, eps, nodePortEvery) {
		out = append(out, DestinationsOf(s)...)
	}
	return out
}

// benchServices returns n TCP services with eps endpoints each, addressed
// like the backends' benchmark plans, every nodePortEvery-th with a node
// port.
func benchServices(n, eps, nodePortEvery int) []*plan.Service {
	var out []*plan.Service
	for i := range n {
		s := &plan.Service{
			Key:        plan.Key{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: plan.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})},
			Port:       80,
		}
		if i%nodePortEvery == 0 {
			s.NodePort = uint16(30000 + i/nodePortEvery)
		}
		for j := range eps {
			s.Endpoints = append(s.Endpoints, plan.Endpoint{
				Address: netip.AddrFrom4([4]byte{10, 128 + byte(i>>12), byte(i >> 4), byte(i<<4) + byte(j)}),
				Port:    8080, Ready: true, Serving: true, ForCluster: true, Weight: 1,
			})
		}
		out = append(out, s)
	}
	return out
}

// BenchmarkSignals reads the live signals of 10k services x 10 endpoints,
// as a least-conn plugin matching every service would have weir run read
// them each interval, from a table of 100k established TCP entries: the
// read of BenchmarkLoad plus laying the counts out per endpoint.
func BenchmarkSignals(b *testing.B) {
	services := benchServices(10000, 10, 10)
	ns := netns.Empty(b, b)
	insertEntries(b, ns, benchServing(10000, 10, 10), 100000)
	c, err := New(ns, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	l := NewLoad(c, Limits{MaxTime: -1})
	for b.Loop() {
		sigs, err := l.Signals(b.Context(), services)
		if err != nil || len(sigs) != len(services) {
			b.Fatalf("Signals: %d services, %v", len(sigs), err)
		}
	}
}

// insertEntries adds n established TCP entries to the table of ns over
// ctnetlink: nine in ten to serving's cluster IPs, DNATed to their
// endpoints in turn, the rest to addresses no service has. It returns how
// many go to a service.
func insertEntries(b *testing.B, ns int, serving []Serving, n int) (matching int) {
	b.Helper()
	c, err := dial(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	var vips []Serving
	for _, s := range serving {
		if s.Dest.Addr().IsValid() {
			vips = append(vips, s)
		}
	}
	var batch [][]byte
	for i := range n {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 16, byte(i / 50000), 1}), uint16(1024+i%50000))
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)}), 443)
		reply := dst
		if i%10 != 9 {
			s := vips[i%len(vips)]
			dst, reply = s.Dest, netip.AddrPortFrom(s.Endpoints[(i/len(vips))%len(s.Endpoints)], 8080)
			matching++
		}
		batch = append(batch, newEntryAttrs(client, dst, reply))
		if len(batch) == 256 || i == n-1 {
			if err := c.create(batch); err != nil {
				b.Fatalf("insert conntrack entries: %v", err)
			}
			batch = batch[:0]
		}
	}
	return matching
}

// newEntryAttrs is the payload, after nfgenmsg, of an IPCTNL_MSG_CT_NEW
// for an established TCP connection from client to dst answered by reply.
func newEntryAttrs(client, dst, reply netip.AddrPort) []byte {
	b := tupleAttr(ctaTupleOrig, unix.IPPROTO_TCP, client, dst)
	b = append(b, tupleAttr(ctaTupleReply, unix.IPPROTO_TCP, reply, client)...)
	b = append(b, nla(7, be32(3600))...) // CTA_TIMEOUT: outlives the benchmark
	return append(b, nla(ctaProtoInfo|unix.NLA_F_NESTED,
		nla(ctaProtoInfoTCP|unix.NLA_F_NESTED, nla(ctaProtoInfoTCPState, []byte{tcpEstablished})))...)
}

// create sends one write of IPv4 entry creations and waits for every ack.
func (c *conn) create(batch [][]byte) error {
	first := c.seq + 1
	var req []byte
	for _, attrs := range batch {
		c.seq++
		req = header(req, msgCtNew, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, c.seq, unix.AF_INET, len(attrs))
		req = append(req, attrs...)
	}
	if err := c.write(req); err != nil {
		return err
	}
	for pending := len(batch); pending > 0; {
		msgs, err := c.read()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq-first >= uint32(len(batch)) {
				continue
			}
			pending--
			if err := ackError(m); err != nil {
				return fmt.Errorf("entry %d of the batch: %w", m.Header.Seq-first, err)
			}
		}
	}
	return nil
}
