package health

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
)

// Service is one Service with externalTrafficPolicy: Local as its health
// check sees it.
type Service struct {
	// Namespace and Name identify the Service.
	Namespace, Name string
	// Port is the Service's spec.healthCheckNodePort; entries with 0 are ignored.
	Port uint16
	// LocalEndpoints counts the Service's ready endpoints on this node.
	LocalEndpoints int
}

// Options configures [NewServers].
type Options struct {
	// Addresses are the node addresses every port listens on; empty means
	// all addresses of every family (one dual-stack wildcard listener).
	Addresses []netip.Addr
	// Healthy reports whether the proxy itself is healthy; nil means always.
	// It is called on every probe, from many goroutines at once.
	Healthy func() bool
	// Log receives open, close and failure messages; nil discards them.
	Log *slog.Logger
	// ListenConfig opens one listener; nil means [net.Listen]. Tests and
	// network-namespace setups replace it.
	ListenConfig func(network, address string) (net.Listener, error)
}

// Servers runs one HTTP server per health-check node port.
//
// It is safe for concurrent use; Sync and Close serialise with each other
// while probes are answered without taking their lock.
type Servers struct {
	binds   []bind
	healthy func() bool
	log     *slog.Logger
	listen  func(network, address string) (net.Listener, error)

	mu     sync.Mutex
	closed bool
	ports  map[uint16]*portServer
}

// bind is one address every port listens on.
type bind struct {
	network string
	host    string // "" for the wildcard
	err     error  // set for an address that cannot be bound at all
}

// NewServers returns an empty set of servers; Sync opens them.
func NewServers(opts Options) *Servers {
	s := &Servers{
		binds:   binds(opts.Addresses),
		healthy: opts.Healthy,
		log:     opts.Log,
		listen:  opts.ListenConfig,
		ports:   map[uint16]*portServer{},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.listen == nil {
		s.listen = net.Listen
	}
	return s
}

// binds turns the configured addresses into listen calls. An IPv4 address
// listens on tcp4 and an IPv6 one on tcp6 (IPV6_V6ONLY), so 0.0.0.0 and ::
// can both be listed without colliding.
func binds(addrs []netip.Addr) []bind {
	if len(addrs) == 0 {
		return []bind{{network: "tcp"}}
	}
	out := make([]bind, 0, len(addrs))
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if seen[a] {
			continue
		}
		seen[a] = true
		switch {
		case !a.IsValid():
			out = append(out, bind{err: errors.New("invalid (zero) bind address in Options.Addresses")})
		case a.Is4():
			out = append(out, bind{network: "tcp4", host: a.String()})
		default:
			out = append(out, bind{network: "tcp6", host: a.String()})
		}
	}
	return out
}

// Sync makes the set of servers match services: it opens listeners for new
// ports, closes those no longer wanted, and updates counts in place.
//
// Only ports that appear or disappear cost listener work; a changed count or
// owner is swapped into the running server. When two services claim one
// port, the first by namespace/name keeps it and the other is reported in
// the returned error. A port that cannot be bound is reported with its
// service and retried on the next Sync while every other port keeps serving.
// Entries for the same service and port are merged, keeping the largest
// count. The error, if any, joins one error per problem, ordered by port.
func (s *Servers) Sync(services []Service) error {
	want, errs := desired(services)

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("health: sync after close: %w", net.ErrClosed)
	}
	for port, ps := range s.ports {
		if _, ok := want[port]; ok && !ps.broken.Load() {
			continue
		}
		cur := ps.state.Load()
		s.log.Info("closing health check node port", "port", port, "service", cur.key())
		if err := ps.close(); err != nil {
			s.log.Warn("closing health check node port", "port", port, "error", err)
		}
		delete(s.ports, port)
	}
	for port, svc := range want {
		if ps := s.ports[port]; ps != nil {
			ps.update(svc, s.log)
			continue
		}
		ps, err := s.open(svc)
		if err != nil {
			errs = append(errs, portError{port, fmt.Errorf("service %s/%s: health check node port %d: %w", svc.Namespace, svc.Name, port, err)})
			continue
		}
		s.log.Info("opened health check node port", "port", port, "service", svc.Namespace+"/"+svc.Name)
		s.ports[port] = ps
	}
	return joinByPort(errs)
}

// Close closes every server and listener; later Syncs fail.
func (s *Servers) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for port, ps := range s.ports {
		if err := ps.close(); err != nil {
			errs = append(errs, fmt.Errorf("health check node port %d: %w", port, err))
		}
		delete(s.ports, port)
	}
	return errors.Join(errs...)
}

// portError is one problem found by Sync, sorted by port before joining.
type portError struct {
	port uint16
	err  error
}

func joinByPort(errs []portError) error {
	if len(errs) == 0 {
		return nil
	}
	slices.SortStableFunc(errs, func(a, b portError) int { return cmp.Compare(a.port, b.port) })
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e.err
	}
	return errors.Join(out...)
}

// desired picks one owner per port: the least namespace/name wins. It
// returns the owners and one conflict error per losing service.
func desired(services []Service) (map[uint16]Service, []portError) {
	want := make(map[uint16]Service, len(services))
	var losers map[uint16][]Service
	for _, svc := range services {
		if svc.Port == 0 {
			continue
		}
		cur, ok := want[svc.Port]
		switch {
		case !ok:
			want[svc.Port] = svc
		case sameService(cur, svc):
			cur.LocalEndpoints = max(cur.LocalEndpoints, svc.LocalEndpoints)
			want[svc.Port] = cur
		default:
			if losers == nil {
				losers = map[uint16][]Service{}
			}
			if compareService(svc, cur) < 0 {
				want[svc.Port] = svc
				cur, svc = svc, cur
			}
			losers[svc.Port] = append(losers[svc.Port], svc)
		}
	}
	var errs []portError
	for port, ls := range losers {
		w := want[port]
		slices.SortFunc(ls, compareService)
		ls = slices.CompactFunc(ls, sameService)
		for _, l := range ls {
			errs = append(errs, portError{port, fmt.Errorf(
				"service %s/%s: health check node port %d is also claimed by service %s/%s, which keeps it",
				l.Namespace, l.Name, port, w.Namespace, w.Name)})
		}
	}
	return want, errs
}

func sameService(a, b Service) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name
}

func compareService(a, b Service) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// open listens on every bind address for svc.Port and starts serving once
// all listeners are bound; on any failure it closes what it opened.
func (s *Servers) open(svc Service) (*portServer, error) {
	ps := newPortServer(svc, s.healthy, s.log)
	port := strconv.Itoa(int(svc.Port))
	for _, b := range s.binds {
		if b.err != nil {
			ps.closeListeners()
			return nil, b.err
		}
		ln, err := s.listen(b.network, net.JoinHostPort(b.host, port))
		if err != nil {
			ps.closeListeners()
			return nil, err
		}
		ps.listeners = append(ps.listeners, ln)
	}
	ps.start()
	return ps, nil
}
