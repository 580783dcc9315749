package diagnose

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// dialTimeout bounds each connection to one of Weir's servers.
const dialTimeout = 500 * time.Millisecond

// servers checks that something listens at the healthz and metrics
// addresses of the config, when they are set.
func (c *nodeCheck) servers() []Finding {
	var out []Finding
	for _, s := range []struct{ name, addr, code, why string }{
		{"healthz", c.o.HealthzAddress, "node.healthz-not-listening",
			"load balancers and probes that ask /healthz take this node for down"},
		{"metrics", c.o.MetricsAddress, "node.metrics-not-listening",
			"Prometheus cannot scrape Weir's metrics here"},
	} {
		if s.addr == "" {
			continue
		}
		target, err := dialTarget(s.addr)
		if err != nil {
			out = append(out, c.failed("the "+s.name+" server", err))
			continue
		}
		if err := c.dial(target); err != nil {
			out = append(out, nodeFinding(s.code, Warning, "%s: weir run is not running in this network namespace, "+
				"or was started with another %s address than %s; %s", notListening(target, err), s.name, s.addr, s.why))
		}
	}
	return out
}

// dialTarget returns where to connect to reach a server listening on
// addr: an unspecified host (0.0.0.0, ::, none) is reached on loopback.
func dialTarget(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}

// dial makes a TCP connection to target and closes it.
func (c *nodeCheck) dial(target string) error {
	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(c.ctx, "tcp", target)
	if err != nil {
		return err
	}
	return conn.Close()
}

// notListening says why a connection to target failed.
func notListening(target string, err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "nothing listens on " + target
	}
	return fmt.Sprintf("cannot connect to %s (%v)", target, err)
}
