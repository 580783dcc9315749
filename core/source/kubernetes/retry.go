package kubernetes

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/url"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Backoff between attempts to reach the API server, like client-go's
// reflector: the delay starts at backoffInitial, doubles up to backoffMax,
// and each wait is the delay plus up to as much again at random, so that
// the nodes of a cluster do not all come back at the same moment.
const (
	backoffInitial = 800 * time.Millisecond
	backoffMax     = 30 * time.Second
)

// backoff is the delay before the next attempt of one list or watch.
type backoff struct {
	initial, max time.Duration
	delay        time.Duration // the delay before jitter; 0 after a success
}

// next returns how long to wait before the next attempt and grows the delay.
func (b *backoff) next() time.Duration {
	if b.delay == 0 {
		b.delay = b.initial
	} else {
		b.delay = min(2*b.delay, b.max)
	}
	return b.delay + rand.N(b.delay+1)
}

// reset starts the next run of failures at the initial delay.
func (b *backoff) reset() { b.delay = 0 }

// retrying is the list and watch of one informer. Requests that fail
// because the API server cannot be reached or refuses Weir (connection
// errors, no answer, 401, 403, 429, 500, 502, 503) are retried here with a
// backoff whose every step is logged and reported, and whose waits end
// with the context. Other errors go to client-go's reflector, which knows
// what they mean (an expired resource version, a server without streaming
// lists) and retries with its own backoff.
//
// Retrying here also keeps stops prompt: the reflector waits out its
// backoff after a refused streaming list without looking at its context
// (client-go v0.37, Reflector.watchList), and never reports that error.
type retrying struct {
	inner cache.ListerWatcherWithContext
	obj   *watched
	wait  func(ctx context.Context, d time.Duration) bool
}

var (
	_ cache.ListerWatcher            = (*retrying)(nil)
	_ cache.ListerWatcherWithContext = (*retrying)(nil)
)

// List lists without a context, for callers that know no other way.
func (r *retrying) List(opts metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), opts)
}

// Watch watches without a context, for callers that know no other way.
func (r *retrying) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), opts)
}

// ListWithContext lists, retrying while the API server cannot be reached.
func (r *retrying) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return attempt(ctx, r, "list", func(ctx context.Context) (runtime.Object, error) {
		return r.inner.ListWithContext(ctx, opts)
	})
}

// WatchWithContext starts a watch, retrying while the API server cannot be
// reached. A watch that streams the initial objects is named a list in
// logs, which is what it does.
func (r *retrying) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	op := "watch"
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		op = "list"
	}
	return attempt(ctx, r, op, func(ctx context.Context) (watch.Interface, error) {
		return r.inner.WatchWithContext(ctx, opts)
	})
}

// attempt calls request until it succeeds, fails for a reason the
// reflector handles, or ctx ends; then it returns ctx's error, which the
// reflector takes for a stop.
func attempt[T any](ctx context.Context, r *retrying, op string, request func(context.Context) (T, error)) (T, error) {
	for {
		r.obj.started(op)
		reqCtx, note := withFailureNote(ctx)
		v, err := request(reqCtx)
		if err == nil && note.failure() != nil {
			if w, ok := any(v).(watch.Interface); ok {
				w.Stop() // the empty watch client-go made of the failure
			}
			err = note.failure()
		}
		switch {
		case ctx.Err() != nil:
			r.obj.stopped()
			var zero T
			return zero, ctx.Err()
		case err == nil || !unreachable(err):
			r.obj.reached()
			return v, err
		}
		if !r.wait(ctx, r.obj.failed(op, cause(err))) {
			var zero T
			return zero, ctx.Err()
		}
	}
}

// cause returns what went wrong with a request without the request's URL,
// which the logs name otherwise (the server and the objects) and whose
// query would drown the reason.
func cause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// unreachable reports whether err means that the API server could not be
// reached or would not serve Weir, as opposed to an answer the reflector
// must act on.
func unreachable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // no answer at all: connection, TLS, timeout, EOF
	}
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || status.Status().Code == 502
}

// sleep waits d or until ctx ends, and reports whether it waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
