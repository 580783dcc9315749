package compare

import (
	"context"
	"fmt"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Loading. Creating a ClusterIP Service costs kube-apiserver v1.37 time
// in proportion to the Services that exist: each allocation lists every
// IPAddress object twice to update its metrics
// (pkg/registry/core/service/ipallocator/ipallocator.go, createIPAddress
// and Used). So each Service is created once, as the sizes grow, and
// never deleted: a size with fewer services hides the rest with the
// labels both proxies' informers leave out (service-proxy-name on the
// Service, headless on its slice), and a size with another endpoint count
// rewrites the slices.

// The label that hides a Service from both proxies (kube-proxy's
// apis.LabelServiceProxyName), with the proxy name it gets here.
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	hiddenProxy           = "compare-hidden"
)

// cluster is what the load has written: services 0 to len(eps)-1.
type cluster struct {
	// eps is each service's endpoint count, hidden whether it is hidden.
	eps    []int
	hidden []bool
	// versions is each visible slice's version, which the churn advances.
	versions []int
}

// loadChanges counts what one resize wrote.
type loadChanges struct {
	created, hidden, shown, rewritten atomic.Int64
	writes                            atomic.Int64
}

// resize makes the API hold size: services 0 to size.Services-1 visible
// with size.Endpoints endpoints each, any others hidden.
func (w *writer) resize(ctx context.Context, c *cluster, size Size, ch *loadChanges) error {
	old := len(c.eps)
	err := w.each(ctx, old, func(ctx context.Context, i int) error {
		return w.reshape(ctx, c, i, size, ch)
	})
	if err != nil || size.Services <= old {
		return err
	}
	svcs, err := loadServices(size)
	if err != nil {
		return err
	}
	c.eps = append(c.eps, make([]int, size.Services-old)...)
	c.hidden = append(c.hidden, make([]bool, size.Services-old)...)
	c.versions = append(c.versions, make([]int, size.Services-old)...)
	return w.each(ctx, size.Services-old, func(ctx context.Context, k int) error {
		i := old + k
		n, err := w.createOne(ctx, svcs[i], loadSlice(i, size.Endpoints, 0, false))
		ch.writes.Add(int64(n))
		if err == nil {
			c.eps[i] = size.Endpoints
			ch.created.Add(1)
		}
		return err
	})
}

// reshape hides, shows or rewrites existing service i for size.
func (w *writer) reshape(ctx context.Context, c *cluster, i int, size Size, ch *loadChanges) error {
	hide := i >= size.Services
	eps := c.eps[i]
	if !hide {
		eps = size.Endpoints
	}
	if hide == c.hidden[i] && eps == c.eps[i] {
		return nil
	}
	if hide != c.hidden[i] {
		if err := w.labelService(ctx, fmt.Sprintf("svc-%d", i), hide); err != nil {
			return err
		}
		ch.writes.Add(1)
		if hide {
			ch.hidden.Add(1)
		} else {
			ch.shown.Add(1)
		}
	}
	if eps != c.eps[i] {
		ch.rewritten.Add(1)
	}
	if err := w.putSlice(ctx, loadSlice(i, eps, c.versions[i], hide), false); err != nil {
		return err
	}
	ch.writes.Add(1)
	c.eps[i], c.hidden[i] = eps, hide
	return nil
}

// labelService sets or removes a Service's hiding label.
func (w *writer) labelService(ctx context.Context, name string, hide bool) error {
	value := "null"
	if hide {
		value = fmt.Sprintf("%q", hiddenProxy)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, labelServiceProxyName, value)
	err := retry(ctx, func() error {
		_, err := w.client.CoreV1().Services(loadNamespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("label service %s: %w", name, err)
	}
	return nil
}
