package nftables

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// measure adds to a benchmark's figures what time and allocations do not
// show: CPU time per op (user and system, so the kernel's work inside a
// commit's sendmsg counts, though not what it defers to its workers) and
// its system part, the
// peak RSS of an op above the RSS before it, and the heap still live after
// the last op above what was live before the first.
type measure struct {
	b *testing.B
	// keep is what the ops use (the plan), live until report.
	keep  any
	heap0 uint64
	// cpu and sys are the CPU time of the ops, sys its system part.
	cpu, sys time.Duration
	// peak is the largest growth of the peak RSS during an op, bytes.
	peak int64
}

// startMeasure collects garbage, notes the live heap and resets the
// timer; keep, which the ops use, stays live until report.
func startMeasure(b *testing.B, keep any) *measure {
	m := &measure{b: b, keep: keep, heap0: liveHeap()}
	b.ResetTimer()
	return m
}

// op runs one timed operation.
func (m *measure) op(fn func()) {
	m.b.StopTimer()
	rss := resetPeakRSS(m.b)
	cpu, sys := cpuTime()
	m.b.StartTimer()
	fn()
	m.b.StopTimer()
	cpu1, sys1 := cpuTime()
	m.cpu, m.sys = m.cpu+cpu1-cpu, m.sys+sys1-sys
	m.peak = max(m.peak, procStatus(m.b, "VmHWM")-rss)
	m.b.StartTimer()
}

// report adds the figures to the benchmark's.
func (m *measure) report() {
	m.b.StopTimer()
	if m.b.N == 0 {
		return
	}
	live := int64(liveHeap()) - int64(m.heap0)
	runtime.KeepAlive(m.keep)
	m.b.ReportMetric(float64(m.cpu.Microseconds())/1e3/float64(m.b.N), "cpu-ms/op")
	m.b.ReportMetric(float64(m.sys.Microseconds())/1e3/float64(m.b.N), "sys-ms/op")
	m.b.ReportMetric(float64(m.peak)/1e6, "peak-MB")
	m.b.ReportMetric(float64(live)/1e6, "live-MB")
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// cpuTime returns the process's CPU time and its system part.
func cpuTime() (cpu, sys time.Duration) {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0, 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano()), time.Duration(r.Stime.Nano())
}

// resetPeakRSS resets the process's peak RSS (VmHWM) to its RSS, which
// it returns.
func resetPeakRSS(b *testing.B) int64 {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
	return procStatus(b, "VmRSS")
}

// procStatus returns a field of /proc/self/status in bytes.
func procStatus(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal(fmt.Errorf("/proc/self/status has no %s", field))
	return 0
}
