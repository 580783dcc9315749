package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// Limits on a connection to the API server, so that one that does not
// answer fails with a reason instead of hanging. client-go adds its own
// 10 s TLS handshake timeout and HTTP/2 pings of idle connections.
const (
	// connectTimeout bounds establishing a TCP connection.
	connectTimeout = 10 * time.Second
	// answerTimeout bounds the wait for a response's headers: the API
	// server's own request timeout (its --request-timeout) is one
	// minute, so a healthy but busy server has answered by then.
	answerTimeout = time.Minute
)

// limits are the connection limits applied to a client configuration.
type limits struct {
	connect, answer time.Duration
}

// defaultLimits are the limits Config applies.
var defaultLimits = limits{connect: connectTimeout, answer: answerTimeout}

// apply sets the limits on cfg: a dialer with a connect timeout, and a
// transport wrapper that gives up on requests unanswered after l.answer.
func (l limits) apply(cfg *rest.Config) {
	cfg.Dial = (&net.Dialer{Timeout: l.connect, KeepAlive: 30 * time.Second}).DialContext
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &answerWithin{next: rt, timeout: l.answer}
	})
}

// answerWithin is a RoundTripper that cancels a request whose response
// headers have not arrived within timeout. A watch that resumes is left
// alone: a proxy in front of the API server may hold its headers back
// until the first event, which can take minutes on a quiet watch. A watch
// that streams the initial list sends events at once, so it is bounded.
type answerWithin struct {
	next    http.RoundTripper
	timeout time.Duration
}

// RoundTrip sends req, cancelling it if no answer comes within the timeout.
func (a *answerWithin) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	if q.Get("watch") == "true" && q.Get("sendInitialEvents") != "true" {
		resp, err := a.next.RoundTrip(req)
		noteFailure(req.Context(), err)
		return resp, err
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(a.timeout, func() {
		cancel(fmt.Errorf("no answer from the API server within %v", a.timeout))
	})
	resp, err := a.next.RoundTrip(req.WithContext(ctx))
	if !timer.Stop() && err == nil {
		resp.Body.Close() // the answer came as the time ran out
		err = context.Cause(ctx)
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && req.Context().Err() == nil {
			err = cause // say why the request was cancelled
		}
		cancel(nil)
		noteFailure(req.Context(), err)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose releases a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

// Close closes the body and releases the request's context.
func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

// failureNote holds the transport error of a request, for a caller that
// client-go would not tell: rest.Request.Watch turns a connection that
// breaks or times out into an empty watch and no error.
type failureNote struct {
	mu  sync.Mutex
	err error
}

// noteKey is the context key of a request's failureNote.
type noteKey struct{}

// withFailureNote returns a context whose requests note their transport
// errors in the returned note.
func withFailureNote(ctx context.Context) (context.Context, *failureNote) {
	n := &failureNote{}
	return context.WithValue(ctx, noteKey{}, n), n
}

// noteFailure records err in ctx's failureNote, if it has one.
func noteFailure(ctx context.Context, err error) {
	if n, ok := ctx.Value(noteKey{}).(*failureNote); ok && err != nil {
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
	}
}

// failure returns the error noted, if any.
func (n *failureNote) failure() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}
