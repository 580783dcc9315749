package files

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// op is what happened to a path, as a set of bits.
type op uint32

const (
	opCreate     op = 1 << iota // created, or moved in
	opWrite                     // written to (or truncated); more may follow
	opCloseWrite                // closed by a writer: its write is complete
	opRemove                    // removed
	opRename                    // moved away
	opChmod                     // attributes changed
)

// fsEvent is one change to a path in a watched directory, or to the
// directory itself.
type fsEvent struct {
	name string
	op   op
}

// has reports whether the event includes o.
func (e fsEvent) has(o op) bool { return e.op&o != 0 }

// errOverflow reports that the kernel dropped events: only a rescan knows
// the state now.
var errOverflow = errors.New("inotify event queue overflowed")

// watchMask is what the watcher asks the kernel about each directory.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_CLOSE_WRITE |
	unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB |
	unix.IN_ONLYDIR

// watcher watches directories through Linux inotify. Unlike fsnotify it
// reports when a writer closes a file (IN_CLOSE_WRITE), which is how the
// source tells a file being written from one that is complete.
type watcher struct {
	fd     int      // the inotify descriptor, for adding and removing watches
	file   *os.File // the same, for reading (never call its Fd: that blocks it)
	events chan fsEvent
	errors chan error
	done   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	paths map[int32]string // directory by watch descriptor
	wds   map[string]int32 // watch descriptor by directory
}

// newWatcher returns a watcher that watches nothing yet.
func newWatcher() (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &watcher{
		fd: fd,
		// A non-blocking descriptor makes the file pollable, so a read
		// waits in the runtime's poller and Close ends it.
		file:   os.NewFile(uintptr(fd), "inotify"),
		events: make(chan fsEvent, 256),
		errors: make(chan error, 1),
		done:   make(chan struct{}),
		paths:  map[int32]string{},
		wds:    map[string]int32{},
	}
	w.wg.Go(w.read)
	return w, nil
}

// add watches dir, following a symbolic link. Adding a path again
// re-resolves it: if it now leads to another directory, the old watch is
// dropped.
func (w *watcher) add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	if old, ok := w.wds[dir]; ok && old != int32(wd) {
		w.drop(old)
	}
	if other, ok := w.paths[int32(wd)]; ok && other != dir {
		delete(w.wds, other) // the same directory through another path
	}
	w.paths[int32(wd)] = dir
	w.wds[dir] = int32(wd)
	return nil
}

// remove stops watching dir.
func (w *watcher) remove(dir string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wd, ok := w.wds[dir]; ok {
		w.drop(wd)
	}
}

// drop removes a watch and forgets it. w.mu is held.
func (w *watcher) drop(wd int32) {
	_, _ = unix.InotifyRmWatch(w.fd, uint32(wd)) // fails if the directory is gone: fine
	delete(w.wds, w.paths[wd])
	delete(w.paths, wd)
}

// close stops the watcher and waits for its reader.
func (w *watcher) close() error {
	close(w.done)
	err := w.file.Close()
	w.wg.Wait()
	return err
}

// read turns what the kernel reports into events until the watcher is
// closed or reading fails; then it closes both channels.
func (w *watcher) read() {
	defer close(w.events)
	defer close(w.errors)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.send(nil, fmt.Errorf("inotify read: %w", err))
			}
			return
		}
		if !w.parse(buf[:n]) {
			return
		}
	}
}

// parse sends the events in buf; it reports false once the watcher is closed.
func (w *watcher) parse(buf []byte) bool {
	for len(buf) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(buf) {
			return true // the kernel never splits an event; be safe anyway
		}
		name := string(buf[unix.SizeofInotifyEvent:end])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		buf = buf[end:]
		if ev, ok := w.event(raw.Wd, raw.Mask, name); ok && !w.send(&ev, nil) {
			return false
		}
		if raw.Mask&unix.IN_Q_OVERFLOW != 0 && !w.send(nil, errOverflow) {
			return false
		}
	}
	return true
}

// event turns one kernel event into an fsEvent, if it is one the source
// cares about.
func (w *watcher) event(wd int32, mask uint32, name string) (fsEvent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dir, ok := w.paths[wd]
	if !ok {
		return fsEvent{}, false // removed meanwhile
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, dir)
		delete(w.paths, wd)
		return fsEvent{}, false
	}
	path := dir
	if name != "" {
		path = filepath.Join(dir, name)
	}
	var o op
	for _, m := range []struct {
		mask uint32
		op   op
	}{
		{unix.IN_CREATE | unix.IN_MOVED_TO, opCreate},
		{unix.IN_MODIFY, opWrite},
		{unix.IN_CLOSE_WRITE, opCloseWrite},
		{unix.IN_DELETE | unix.IN_DELETE_SELF, opRemove},
		{unix.IN_MOVED_FROM | unix.IN_MOVE_SELF, opRename},
		{unix.IN_ATTRIB, opChmod},
	} {
		if mask&m.mask != 0 {
			o |= m.op
		}
	}
	return fsEvent{name: path, op: o}, o != 0
}

// send delivers an event or an error; it reports false once the watcher
// is closed.
func (w *watcher) send(ev *fsEvent, err error) bool {
	if ev != nil {
		select {
		case w.events <- *ev:
			return true
		case <-w.done:
			return false
		}
	}
	select {
	case w.errors <- err:
	default: // one pending error is enough: it triggers a rescan
	}
	return true
}
