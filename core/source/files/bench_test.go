package files

import (
	"context"
	"log/slog"
	"runtime"
	"testing"

	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/test/scale"
)

// benchServices is how many services the benchmarks load, one file each.
const benchServices = 10000

// benchDir writes the manifests of benchServices services into a fresh directory.
func benchDir(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	if err := scale.WriteAll(dir, benchServices, 10); err != nil {
		b.Fatal(err)
	}
	return dir
}

// rewrite writes a new version of service 5000's file, one endpoint moved.
func rewrite(b *testing.B, dir string, version int) {
	if err := scale.Write(dir, 5000, 10, version); err != nil {
		b.Fatal(err)
	}
}

// signaller is a handler that counts records and signals OnSynced and every
// EndpointSlice update.
type signaller struct {
	source.Handler // never called: the source delivers records
	objects        int
	synced         chan struct{}
	updated        chan struct{}
}

func newSignaller() *signaller {
	return &signaller{synced: make(chan struct{}, 1), updated: make(chan struct{}, 1)}
}

func (s *signaller) OnServiceRecord(prev, cur *source.Service) { s.objects++ }
func (s *signaller) OnNodeRecord(prev, cur *source.Node)       { s.objects++ }
func (s *signaller) OnSynced()                                 { s.synced <- struct{}{} }

func (s *signaller) OnEndpointSliceRecord(prev, cur *source.EndpointSlice) {
	s.objects++
	if prev != nil && cur != nil {
		s.updated <- struct{}{}
	}
}

// startRun runs a source over dir until the benchmark ends and waits for its
// initial load.
func startRun(b *testing.B, dir string) *signaller {
	b.Helper()
	h := newSignaller()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(dir, nil).Run(ctx, h) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	select {
	case <-h.synced:
	case err := <-done:
		b.Fatal(err)
	}
	return h
}

// BenchmarkInitialLoad10k measures Run from its start to OnSynced over 10,000
// service files, and reports the heap the source keeps afterwards.
func BenchmarkInitialLoad10k(b *testing.B) {
	dir := benchDir(b)
	var heap uint64
	for b.Loop() {
		h := newSignaller()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- New(dir, nil).Run(ctx, h) }()
		<-h.synced
		b.StopTimer()
		heap = liveHeap()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if h.objects != 2*benchServices {
			b.Fatalf("delivered %d objects, want %d", h.objects, 2*benchServices)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(heap)/(1<<20), "live-MB")
}

// liveHeap returns the bytes of heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkReloadOneFile10k measures one rewritten file among 10,000 reaching
// the handler as an EndpointSlice update: "flush" from the write through the
// reload the debounce timer would trigger, "watch" end to end through a real
// Run, including inotify and the debounce delay.
func BenchmarkReloadOneFile10k(b *testing.B) {
	dir := benchDir(b)
	path := scale.Path(dir, 5000)
	b.Run("flush", func(b *testing.B) {
		w, err := newWatcher()
		if err != nil {
			b.Fatal(err)
		}
		defer w.close()
		h := newSignaller()
		r := newRun(New(dir, nil), w, h)
		if err := r.rescan(); err != nil {
			b.Fatal(err)
		}
		deliver(h, r.st.diff())
		version := 0
		for b.Loop() {
			version = 1 + version%2
			rewrite(b, dir, version)
			r.pending[path] = true
			r.flush()
			<-h.updated
		}
	})
	b.Run("watch", func(b *testing.B) {
		h := startRun(b, dir)
		version := 0
		for b.Loop() {
			version = 3 + version%2
			rewrite(b, dir, version)
			<-h.updated
		}
	})
}

// BenchmarkDecodeFile decodes one of the benchmark's service files: "fast" as
// the source does, "yaml" through sigs.k8s.io/yaml alone, as it did before
// fastYAMLToJSON.
func BenchmarkDecodeFile(b *testing.B) {
	data := scale.Manifest(4242, 10, 0)
	log := slog.New(slog.DiscardHandler)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			decodeFile(log, source.NewCompactor(), "svc.yaml", data)
		}
	})
	b.Run("yaml", func(b *testing.B) {
		for b.Loop() {
			decodeThroughYAML(log, "svc.yaml", data)
		}
	})
}
