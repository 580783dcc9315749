package netns

import (
	"context"
	"net"
	"net/http"
	"time"
)

// HTTPClient returns an HTTP client whose connections start in n, one
// connection per request, each request bounded by timeout.
func (n *Namespace) HTTPClient(timeout time.Duration) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := n.Do(func() (err error) {
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}
