package health

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Limits for one health-check server; probes are tiny and frequent.
const (
	readHeaderTimeout = 10 * time.Second
	writeTimeout      = 10 * time.Second
	idleTimeout       = 90 * time.Second
	maxHeaderBytes    = 16 << 10
)

// portServer is the HTTP server behind one health-check node port, on every
// bind address.
type portServer struct {
	healthy   func() bool
	log       *slog.Logger
	srv       *http.Server
	listeners []net.Listener
	wg        sync.WaitGroup

	// state is swapped by Sync and read by every probe.
	state atomic.Pointer[snapshot]
	// closing is set before the server is closed on purpose.
	closing atomic.Bool
	// broken is set when a listener stops serving on its own; the next
	// Sync reopens the port.
	broken atomic.Bool
}

// snapshot is the immutable answer of one port, with both bodies rendered.
type snapshot struct {
	namespace, name string
	count           int
	weight          string // count, for the X-Load-Balancing-Endpoint-Weight header
	bodyHealthy     []byte
	bodyUnhealthy   []byte
}

func newSnapshot(svc Service) *snapshot {
	count := max(svc.LocalEndpoints, 0)
	return &snapshot{
		namespace:     svc.Namespace,
		name:          svc.Name,
		count:         count,
		weight:        strconv.Itoa(count),
		bodyHealthy:   renderBody(svc.Namespace, svc.Name, count, true),
		bodyUnhealthy: renderBody(svc.Namespace, svc.Name, count, false),
	}
}

func (st *snapshot) key() string { return st.namespace + "/" + st.name }

// renderBody writes the JSON kube-proxy answers, byte for byte: tab
// indented, no trailing newline.
func renderBody(namespace, name string, count int, healthy bool) []byte {
	b := make([]byte, 0, 128+len(namespace)+len(name))
	b = append(b, "{\n\t\"service\": {\n\t\t\"namespace\": "...)
	b = appendJSONString(b, namespace)
	b = append(b, ",\n\t\t\"name\": "...)
	b = appendJSONString(b, name)
	b = append(b, "\n\t},\n\t\"localEndpoints\": "...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, ",\n\t\"serviceProxyHealthy\": "...)
	b = strconv.AppendBool(b, healthy)
	return append(b, "\n}"...)
}

// appendJSONString quotes s as JSON; for Kubernetes names this is the same
// text as kube-proxy's %q.
func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // cannot happen for a string
		return append(b, `""`...)
	}
	return append(b, q...)
}

func newPortServer(svc Service, healthy func() bool, log *slog.Logger) *portServer {
	ps := &portServer{healthy: healthy, log: log}
	ps.state.Store(newSnapshot(svc))
	ps.srv = &http.Server{
		Handler:           ps,
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return ps
}

// ServeHTTP answers any method and path: 200 with local endpoints and a
// healthy proxy, 503 otherwise, always with the JSON body.
func (ps *portServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	st := ps.state.Load()
	healthy := ps.healthy == nil || ps.healthy()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// Load balancers that weigh nodes by it (Google Cloud's weighted
	// backend services) read the count from this header, as kube-proxy sends it.
	h.Set("X-Load-Balancing-Endpoint-Weight", st.weight)
	body := st.bodyUnhealthy
	if healthy {
		body = st.bodyHealthy
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if st.count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}

// update swaps in svc's owner and count when they changed; the listeners
// and open connections are untouched.
func (ps *portServer) update(svc Service, log *slog.Logger) {
	cur := ps.state.Load()
	count := max(svc.LocalEndpoints, 0)
	if cur.namespace == svc.Namespace && cur.name == svc.Name && cur.count == count {
		return
	}
	next := newSnapshot(svc)
	if cur.namespace != svc.Namespace || cur.name != svc.Name {
		log.Info("health check node port changed service", "port", svc.Port, "from", cur.key(), "to", next.key())
	}
	ps.state.Store(next)
}

// start serves every listener in its own goroutine.
func (ps *portServer) start() {
	for _, ln := range ps.listeners {
		ps.wg.Go(func() { ps.serve(ln) })
	}
}

func (ps *portServer) serve(ln net.Listener) {
	err := ps.srv.Serve(ln)
	if ps.closing.Load() || errors.Is(err, http.ErrServerClosed) {
		return
	}
	ps.broken.Store(true)
	ps.log.Error("health check node port stopped serving; it is reopened on the next sync",
		"address", ln.Addr().String(), "service", ps.state.Load().key(), "error", err)
}

// close stops the server, closes its listeners and connections, and waits
// for its goroutines; when it returns the port is free.
func (ps *portServer) close() error {
	ps.closing.Store(true)
	err := ps.srv.Close()
	// A listener whose Serve goroutine has not started yet is not known to
	// srv; close every one here so the port is free when close returns.
	ps.closeListeners()
	ps.wg.Wait()
	return err
}

func (ps *portServer) closeListeners() {
	for _, ln := range ps.listeners {
		_ = ln.Close()
	}
}
