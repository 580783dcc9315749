package kubernetes

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/weirproxy/weir/core/source"
)

// status is what the source knows about reaching the API server, one
// watched per informer. It logs failed attempts and recoveries, and tells
// the handler's source.Reporter that the source is down while the initial
// objects cannot be listed, and up once they are delivered.
type status struct {
	mu       sync.Mutex
	log      *slog.Logger
	server   string
	reporter source.Reporter // nil when the handler is not one
	objs     []*watched
	synced   bool   // the initial objects were all delivered
	down     bool   // OnSourceDown was called, OnSourceUp not since
	downWhy  string // the reason last given to OnSourceDown
}

// watched is the state of one informer's requests.
type watched struct {
	st        *status
	what      string      // "Services", "EndpointSlices", "Node <name>"
	hasSynced func() bool // set once the informer's handler is registered
	backoff   backoff

	attempts int       // failed attempts in a row
	failing  time.Time // when the first of them failed
	lastOp   string    // the request that failed last
	lastErr  error     // and why
	inFlight string    // the request out now, if any
	sentAt   time.Time // when it was sent
}

// newStatus returns the status of a source reading from server.
func newStatus(log *slog.Logger, server string, h source.Handler) *status {
	st := &status{log: log, server: server}
	st.reporter, _ = h.(source.Reporter)
	return st
}

// add returns the state of one more informer.
func (st *status) add(what string, b backoff) *watched {
	w := &watched{st: st, what: what, backoff: b}
	st.objs = append(st.objs, w)
	return w
}

// started records that a request was sent.
func (w *watched) started(op string) {
	w.st.mu.Lock()
	defer w.st.mu.Unlock()
	w.inFlight, w.sentAt = op, time.Now()
}

// stopped records a request ended by a stop.
func (w *watched) stopped() {
	w.st.mu.Lock()
	defer w.st.mu.Unlock()
	w.inFlight = ""
}

// reached records a request the API server answered (with success, or an
// error the reflector acts on), logging the recovery after failures.
func (w *watched) reached() {
	st := w.st
	st.mu.Lock()
	defer st.mu.Unlock()
	w.inFlight = ""
	if w.attempts == 0 {
		return
	}
	st.log.Info("Reached the API server again", "server", st.server, "objects", w.what,
		"failedAttempts", w.attempts, "unreachableFor", time.Since(w.failing).Round(100*time.Millisecond))
	w.attempts, w.lastErr = 0, nil
	w.backoff.reset()
	st.reportUp()
}

// failed records a request that did not reach the API server and returns
// how long to wait before the next attempt. The first failures of a run
// are logged, then every attempt whose number is a power of two and every
// change of reason, so an outage of an hour logs a handful of lines.
func (w *watched) failed(op string, err error) time.Duration {
	st := w.st
	st.mu.Lock()
	defer st.mu.Unlock()
	w.inFlight = ""
	w.attempts++
	if w.attempts == 1 {
		w.failing = time.Now()
	}
	changed := w.lastErr == nil || w.lastErr.Error() != err.Error()
	w.lastOp, w.lastErr = op, err
	delay := w.backoff.next()
	if changed || w.attempts <= 3 || w.attempts&(w.attempts-1) == 0 {
		st.log.Warn("Cannot reach the API server; retrying, rules unchanged", "server", st.server,
			"objects", w.what, "request", op, "attempt", w.attempts,
			"retryIn", delay.Round(100*time.Millisecond), "error", err)
	}
	st.reportDown(w, op, err)
	return delay
}

// reportDown tells the reporter that the source is down, again when the
// reason changes (not when another informer fails alike), but only until
// the initial objects are delivered: an API server that goes away later
// leaves every informer's cache, and the rules, as they were, and must not
// make every node unhealthy at once. st.mu is held.
func (st *status) reportDown(w *watched, op string, err error) {
	if st.reporter == nil || st.synced || (st.down && st.downWhy == err.Error()) {
		return
	}
	st.down, st.downWhy = true, err.Error()
	st.reporter.OnSourceDown(fmt.Errorf("cannot %s %s from the API server at %s: %w", op, w.what, st.server, err))
}

// reportUp tells the reporter that the source is up once the initial
// objects are delivered, if it said it was down. st.mu is held.
func (st *status) reportUp() {
	if !st.down || !st.synced {
		return
	}
	st.down, st.downWhy = false, ""
	st.reporter.OnSourceUp()
}

// markSynced records that the initial objects were delivered.
func (st *status) markSynced() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.synced = true
	st.reportUp()
}

// waitingFor describes the informers whose objects have not all arrived,
// each with what holds it up.
func (st *status) waitingFor() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var parts []string
	for _, w := range st.objs {
		if w.hasSynced != nil && w.hasSynced() {
			continue
		}
		parts = append(parts, w.what+" ("+w.holdUp()+")")
	}
	return strings.Join(parts, "; ")
}

// holdUp says why an informer's objects have not arrived. st.mu is held.
func (w *watched) holdUp() string {
	switch {
	case w.attempts > 0:
		return fmt.Sprintf("%s failed %d times in %v, last: %v", w.lastOp, w.attempts,
			time.Since(w.failing).Round(100*time.Millisecond), w.lastErr)
	case w.inFlight != "":
		return fmt.Sprintf("%s request unanswered for %v", w.inFlight, time.Since(w.sentAt).Round(100*time.Millisecond))
	}
	return "receiving"
}
