package kubernetes

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/weirproxy/weir/core/source"
)

// watchServiceCIDRs delivers the ranges of the cluster's ServiceCIDR
// objects to h until ctx ends. Like kube-proxy, the first sync does not
// wait for them: the next sync after they arrive uses them. A cluster
// that does not serve networking.k8s.io/v1 ServiceCIDRs (before v1.33),
// or a ClusterRole without list and watch on them, is logged once: Weir
// then does without (the serviceCIDRs setting still applies).
func (s *Source) watchServiceCIDRs(ctx context.Context, h source.ServiceCIDRHandler) {
	b := backoff{initial: s.tune.backoffInitial, max: s.tune.backoffMax}
	for {
		_, err := s.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case err == nil:
			s.runServiceCIDRs(ctx, h)
			return
		case ctx.Err() != nil:
			return
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			s.opts.Log.Warn("Cannot watch ServiceCIDRs; traffic to unallocated cluster IPs is not dropped unless serviceCIDRs is set (grant list and watch on servicecidrs.networking.k8s.io, then restart)",
				"server", s.server, "error", err)
			return
		}
		delay := b.next()
		s.opts.Log.Debug("Listing ServiceCIDRs failed; retrying", "error", err, "retryIn", delay)
		if !sleep(ctx, delay) {
			return
		}
	}
}

// runServiceCIDRs runs the ServiceCIDR informer until ctx ends.
func (s *Source) runServiceCIDRs(ctx context.Context, h source.ServiceCIDRHandler) {
	rc := s.client.NetworkingV1().RESTClient()
	lw := listWatch(rc, "servicecidrs", func() runtime.Object { return &networkingv1.ServiceCIDRList{} }, func(*metav1.ListOptions) {})
	inf := cache.NewSharedIndexInformerWithOptions(lw, &networkingv1.ServiceCIDR{},
		cache.SharedIndexInformerOptions{ObjectDescription: "ServiceCIDRs"})
	cidrs := &serviceCIDRs{h: h, byName: map[string][]netip.Prefix{}}
	if _, err := inf.AddEventHandler(handlerFor(cidrs.on)); err != nil {
		s.opts.Log.Warn("Cannot watch ServiceCIDRs", "error", err)
		return
	}
	if err := inf.SetWatchErrorHandlerWithContext(s.watchErrorLogger("ServiceCIDRs")); err != nil {
		s.opts.Log.Warn("Cannot watch ServiceCIDRs", "error", err)
		return
	}
	inf.RunWithContext(ctx)
}

// serviceCIDRs folds ServiceCIDR changes into the list a handler gets.
type serviceCIDRs struct {
	h      source.ServiceCIDRHandler
	mu     sync.Mutex
	byName map[string][]netip.Prefix
}

// on records one ServiceCIDR change and hands the new list on. A range
// that does not parse is left out (the API server validates them).
func (c *serviceCIDRs) on(prev, cur *networkingv1.ServiceCIDR) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur == nil {
		delete(c.byName, prev.Name)
	} else {
		var ps []netip.Prefix
		for _, s := range cur.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				ps = append(ps, p.Masked())
			}
		}
		c.byName[cur.Name] = ps
	}
	var all []netip.Prefix
	for _, ps := range c.byName {
		all = append(all, ps...)
	}
	slices.SortFunc(all, netip.Prefix.Compare)
	c.h.OnServiceCIDRs(slices.Compact(all))
}
