// Package kubernetes is the source that watches a real API server: shared
// informers (k8s.io/client-go) for Services, EndpointSlices and this
// node's Node, delivering their changes to a source.Handler.
//
// Like kube-proxy, it ignores Services and EndpointSlices labelled
// service.kubernetes.io/service-proxy-name (another proxy's) or
// service.kubernetes.io/headless, and watches only the Node named
// Options.NodeName. The first OnSynced comes once all three caches hold
// the API server's objects. When the API server goes away the informers
// keep their caches, so Weir keeps its rules, and reconnect on their own;
// a relist afterwards delivers only what changed meanwhile (updates that
// change nothing are not passed on).
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirproxy/weir/core/source"
)

// proxySelector leaves out the objects kube-proxy leaves out: those of
// another service proxy, and headless services' slices.
const proxySelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// Options configures the source.
type Options struct {
	// NodeName is the Node whose changes are delivered.
	NodeName string
	// Log receives informer errors; slog.Default() when nil.
	Log *slog.Logger
}

// Source watches the API server of one client configuration.
type Source struct {
	client kubernetes.Interface
	opts   Options
}

// Config returns the client configuration of a kubeconfig file, or the
// in-cluster one (the pod's ServiceAccount) when path is empty. Objects are
// read as protobuf, which costs the API server and Weir less than JSON.
func Config(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: in-cluster configuration (set source.kubeconfig outside a pod): %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		return nil, fmt.Errorf("kubernetes: source.kubeconfig %s: %w", path, err)
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.UserAgent = "weir"
	return cfg, nil
}

// New returns a source reading through cfg.
func New(cfg *rest.Config, opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("kubernetes: the source needs a node name")
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Source{client: client, opts: opts}, nil
}

// Run starts the informers, calls h.OnSynced once their caches are full,
// and delivers changes until ctx ends.
func (s *Source) Run(ctx context.Context, h source.Handler) error {
	proxied := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = proxySelector }))
	node := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.opts.NodeName).String()
		}))
	watched := []struct {
		what     string
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{"Services", proxied.Core().V1().Services().Informer(), handlerFor(h.OnService)},
		{"EndpointSlices", proxied.Discovery().V1().EndpointSlices().Informer(), handlerFor(h.OnEndpointSlice)},
		{"Node " + s.opts.NodeName, node.Core().V1().Nodes().Informer(), handlerFor(h.OnNode)},
	}
	var synced []cache.InformerSynced
	for _, w := range watched {
		if err := w.informer.SetTransform(dropManagedFields); err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", w.what, err)
		}
		if err := w.informer.SetWatchErrorHandlerWithContext(s.watchErrorLogger(w.what)); err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", w.what, err)
		}
		reg, err := w.informer.AddEventHandler(w.handler)
		if err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", w.what, err)
		}
		synced = append(synced, reg.HasSynced)
	}
	proxied.Start(ctx.Done())
	node.Start(ctx.Done())
	defer proxied.Shutdown()
	defer node.Shutdown()
	s.opts.Log.Info("Waiting for the API server's objects", "node", s.opts.NodeName)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	h.OnSynced()
	<-ctx.Done()
	return nil
}

// watchErrorLogger logs a watch that broke (the informer retries by
// itself, keeping its cache).
func (s *Source) watchErrorLogger(what string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			s.opts.Log.Warn("Lost the watch of the API server; retrying, rules unchanged", "objects", what, "error", err)
		}
	}
}

// dropManagedFields removes what Weir never reads and caches would keep
// for every object: the server-side apply bookkeeping.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// handlerFor adapts one source.Handler method to informer events.
// Updates whose object did not change (the informer's relists) are not
// passed on; a deletion whose last state the informer missed delivers the
// last state it knew.
func handlerFor[T any, P interface {
	*T
	metav1.Object
}](on func(prev, cur P)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(P); ok {
				on(nil, o)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(P)
			c, ok2 := cur.(P)
			if ok1 && ok2 && o.GetResourceVersion() != c.GetResourceVersion() {
				on(o, c)
			}
		},
		DeleteFunc: func(obj any) {
			if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = gone.Obj
			}
			if o, ok := obj.(P); ok {
				on(o, nil)
			}
		},
	}
}
