package sdktest

import (
	"bufio"
	"io"
	"os"
	"strings"
	"sync"
)

// stderrMu serialises the captures of os.Stderr.
var stderrMu sync.Mutex

// captureStderr runs fn with os.Stderr replaced by a pipe, hands fn the
// pipe's writer too, and returns the lines written to it, without their
// newlines (a last line without one included), with fn's error.
func captureStderr(fn func(w io.Writer) error) ([]string, error) {
	stderrMu.Lock()
	defer stderrMu.Unlock()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	lines := make(chan []string, 1)
	go func() {
		defer r.Close()
		lines <- readLines(r)
	}()
	saved := os.Stderr
	os.Stderr = w
	func() {
		defer func() { os.Stderr = saved }()
		err = fn(w)
	}()
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return <-lines, err
}

// readLines reads r to its end and splits it into lines.
func readLines(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		out = append(out, strings.TrimRight(sc.Text(), "\r"))
	}
	// A line longer than the buffer ends the scan; drain the rest so the
	// writer never blocks.
	_, _ = io.Copy(io.Discard, r)
	return out
}
