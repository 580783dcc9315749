package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weirproxy/weir/core/source"
)

// loaded is one file read and decoded, waiting to be applied to the state.
type loaded struct {
	path     string
	objs     objects
	failures int        // documents that could not be used
	gone     bool       // the file no longer exists
	err      error      // the file could not be read
	logs     logRecords // what decoding logged, to replay in order
}

// loadFiles re-reads the given files, sorted by path, and applies them to
// the state in that order. Reading and decoding run on up to GOMAXPROCS
// goroutines; what they log is held back and replayed file by file, so logs
// and results do not depend on scheduling.
func (st *state) loadFiles(paths []string) {
	results := make([]loaded, len(paths))
	workers := min(runtime.GOMAXPROCS(0), len(paths))
	if workers <= 1 {
		for i, path := range paths {
			results[i] = readFile(st.log.Handler(), st.compact, path)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(len(paths)); i = next.Add(1) - 1 {
					results[i] = readFile(st.log.Handler(), st.compact, paths[i])
				}
			})
		}
		wg.Wait()
	}
	for i := range results {
		st.apply(&results[i])
		results[i] = loaded{}
	}
}

// maxFileBytes is the largest manifest file read: decoding one costs
// several times its size, and 32 MiB holds some 25,000 objects.
const maxFileBytes = 32 << 20

// errFileTooLarge marks a file over maxFileBytes.
var errFileTooLarge = fmt.Errorf("larger than the %d MiB limit for one manifest file", maxFileBytes>>20)

// readFile reads and decodes one file without touching the state, logging
// through a buffer in front of h.
func readFile(h slog.Handler, compact *source.Compactor, path string) loaded {
	l := loaded{path: path}
	info, err := os.Stat(path)
	if err == nil && !info.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	var data []byte
	if err == nil {
		data, err = readAtMost(path, info.Size())
	}
	switch {
	case isGone(err):
		l.gone = true
	case err != nil:
		l.err = err
	default:
		log := slog.New(&logBuffer{next: h, records: &l.logs})
		l.objs, l.failures = decodeFile(log, compact, path, data)
	}
	return l
}

// readAtMost reads a file of the given size unless it, or what is there
// by the time it is read, is larger than maxFileBytes.
func readAtMost(path string, size int64) ([]byte, error) {
	if size > maxFileBytes {
		return nil, fmt.Errorf("%d bytes: %w", size, errFileTooLarge)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(data) > maxFileBytes {
		err = fmt.Errorf("more than %d bytes: %w", maxFileBytes, errFileTooLarge)
	}
	return data, err
}

// apply records a loaded file in the state. A file that is gone drops its
// objects; a file that cannot be read, or is too large, keeps them.
func (st *state) apply(l *loaded) {
	l.logs.replay()
	switch {
	case l.gone:
		st.setFile(l.path, nil)
	case errors.Is(l.err, errFileTooLarge):
		st.log.Warn("Skipping a manifest file that is too large; keeping its last good objects", "file", l.path, "error", l.err)
	case l.err != nil:
		st.log.Warn("Cannot read manifest file; keeping its last good objects", "file", l.path, "error", l.err)
	default:
		if l.failures > 0 {
			st.keepPrevious(l.path, l.objs)
		}
		st.setFile(l.path, l.objs)
	}
}

// isGone reports whether err means the file no longer exists.
func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// keepPrevious adds to objs the objects path defined before that it no longer
// yields: a document that failed to parse may be one of them mid-edit, so a
// broken document never deletes anything.
func (st *state) keepPrevious(path string, objs objects) {
	kept := 0
	for _, k := range st.files[path] {
		if _, ok := objs[k]; !ok {
			objs[k] = st.defined(path, k)
			kept++
		}
	}
	if kept > 0 {
		st.log.Warn("Manifest file has errors; keeping the last good definitions of its other objects",
			"file", path, "kept", kept)
	}
}

// logRecords are log records held back, each with the handler to send it to.
type logRecords []heldRecord

// heldRecord is one log record held back.
type heldRecord struct {
	h slog.Handler
	r slog.Record
}

// replay sends the records to their handlers, in the order they were logged.
func (rs logRecords) replay() {
	for _, hr := range rs {
		_ = hr.h.Handle(context.Background(), hr.r)
	}
}

// logBuffer is a slog.Handler that holds records back instead of handling
// them; it asks the handler behind it which levels are enabled.
type logBuffer struct {
	next    slog.Handler
	records *logRecords
}

// Enabled reports whether the handler behind the buffer handles level.
func (b *logBuffer) Enabled(ctx context.Context, level slog.Level) bool {
	return b.next.Enabled(ctx, level)
}

// Handle holds a copy of r back.
func (b *logBuffer) Handle(_ context.Context, r slog.Record) error {
	*b.records = append(*b.records, heldRecord{h: b.next, r: r.Clone()})
	return nil
}

// WithAttrs returns a buffer in front of the handler with the attributes added.
func (b *logBuffer) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logBuffer{next: b.next.WithAttrs(attrs), records: b.records}
}

// WithGroup returns a buffer in front of the handler with the group opened.
func (b *logBuffer) WithGroup(name string) slog.Handler {
	return &logBuffer{next: b.next.WithGroup(name), records: b.records}
}
