package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Limits of the health and metrics servers: small requests from probes and
// scrapers.
const (
	serverReadHeaderTimeout = 10 * time.Second
	serverIdleTimeout       = 90 * time.Second
	serverShutdownTimeout   = 5 * time.Second
)

// serve listens on addr, the value of the configuration key key, and
// serves h in the background; stop shuts the server down and waits for
// it. An empty addr disables the server. A failure to listen names the key
// and the address.
func serve(env *environment, key, addr string, h http.Handler) (stop func(), err error) {
	if addr == "" {
		env.log.Info("Server disabled: its address is empty", "key", key)
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: cannot listen: %w", key, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: serverReadHeaderTimeout, IdleTimeout: serverIdleTimeout}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			env.log.Error("Server stopped", "key", key, "address", ln.Addr().String(), "error", err)
		}
	}()
	env.log.Info("Serving", "key", key, "address", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), serverShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-done
	}, nil
}

// withProfiling serves Go's profiles under /debug/pprof/ beside h
// (enableProfiling), as kube-proxy does on its metrics port.
func withProfiling(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
