// Package kubernetes is the source that watches a real API server: shared
// informers (k8s.io/client-go) for Services, EndpointSlices and this
// node's Node, delivering their changes to a source.Handler.
//
// Like kube-proxy's informers, it ignores Services labelled
// service.kubernetes.io/service-proxy-name (another proxy's) and headless
// Services (clusterIP None), EndpointSlices labelled
// service.kubernetes.io/headless, and watches only the Node named
// Options.NodeName. The first OnSynced comes once all three caches hold
// the API server's objects. The informers keep records of the objects
// (source.Compactor) and deliver them (see source.Records): what Weir reads
// of them, with the values objects repeat shared between them. A handler that is a source.ServiceCIDRHandler
// also gets the ranges of the ServiceCIDR objects (servicecidrs.go). When the API server goes away the informers
// keep their caches, so Weir keeps its rules, and reconnect on their own;
// a relist afterwards delivers only what changed meanwhile (updates that
// change nothing are not passed on).
//
// A request that cannot reach the API server is retried with a backoff
// that is logged (the reason, the attempt and the next delay). While the
// first objects have not arrived, the source says every little while which
// ones it is still waiting for and why, and a handler that is a
// source.Reporter hears that the source is down, then up once they are
// delivered. Later outages are logged, not reported: the caches and the
// rules stay as they were, and every node turning unhealthy at once would
// fail the load balancers' health checks of the whole cluster.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirproxy/weir/core/source"
)

// The selectors of the objects kube-proxy's informers leave out
// (cmd/kube-proxy/app/server.go): Services of another proxy and headless
// Services, and the slices the EndpointSlice controller labels headless.
// Each selector is on its own kind only: a Service labelled headless is
// proxied, and a slice labelled for another proxy is seen.
const (
	serviceLabels   = "!service.kubernetes.io/service-proxy-name"
	serviceFields   = "spec.clusterIP!=" + corev1.ClusterIPNone
	endpointsLabels = "!" + corev1.IsHeadlessService
)

// While the initial objects have not arrived, the source logs what it is
// waiting for firstReport after it started, then at doubling intervals up
// to maxReport.
const (
	firstReport = 5 * time.Second
	maxReport   = time.Minute
	// stopWait bounds how long Run waits for the informers to stop.
	stopWait = time.Second
)

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
	server string
	opts   Options
	tune   tuning
}

// tuning holds the source's delays; tests shorten them.
type tuning struct {
	backoffInitial, backoffMax time.Duration
	firstReport, maxReport     time.Duration
}

// Config returns the client configuration of a kubeconfig file, or the
// in-cluster one (the pod's ServiceAccount) when path is empty. Objects are
// read as protobuf, which costs the API server and Weir less than JSON.
// Connections time out after 10 s and requests unanswered after a minute
// (resumed watches excepted), so an API server that does not answer shows
// as an error instead of a silent wait.
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
	defaultLimits.apply(cfg)
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
	return &Source{client: client, server: cfg.Host, opts: opts, tune: tuning{
		backoffInitial: backoffInitial, backoffMax: backoffMax, firstReport: firstReport, maxReport: maxReport,
	}}, nil
}

// informer is one of the source's informers with what it watches.
type informer struct {
	obj      *watched
	informer cache.SharedIndexInformer
	handler  cache.ResourceEventHandler
}

// informers returns the source's three informers, their requests
// reporting to st.
func (s *Source) informers(st *status, h source.RecordHandler) []informer {
	services := func(o *metav1.ListOptions) { o.LabelSelector, o.FieldSelector = serviceLabels, serviceFields }
	slices := func(o *metav1.ListOptions) { o.LabelSelector = endpointsLabels }
	node := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.opts.NodeName).String()
	}
	core, discovery := s.client.CoreV1().RESTClient(), s.client.DiscoveryV1().RESTClient()
	return []informer{
		s.informer(st, "Services", &corev1.Service{},
			listWatch(core, "services", func() runtime.Object { return &corev1.ServiceList{} }, services),
			handlerFor(h.OnServiceRecord)),
		s.informer(st, "EndpointSlices", &discoveryv1.EndpointSlice{},
			listWatch(discovery, "endpointslices", func() runtime.Object { return &discoveryv1.EndpointSliceList{} }, slices),
			handlerFor(h.OnEndpointSliceRecord)),
		s.informer(st, "Node "+s.opts.NodeName, &corev1.Node{},
			listWatch(core, "nodes", func() runtime.Object { return &corev1.NodeList{} }, node),
			handlerFor(h.OnNodeRecord)),
	}
}

// informer returns an informer of obj's kind whose requests go through lw,
// retried and reported to st.
func (s *Source) informer(st *status, what string, obj runtime.Object, lw *cache.ListWatch, h cache.ResourceEventHandler) informer {
	w := st.add(what, backoff{initial: s.tune.backoffInitial, max: s.tune.backoffMax})
	inf := cache.NewSharedIndexInformerWithOptions(&retrying{inner: lw, obj: w, wait: sleep}, obj,
		cache.SharedIndexInformerOptions{ObjectDescription: what})
	return informer{obj: w, informer: inf, handler: h}
}

// listWatch returns the list and watch of one resource of every namespace,
// as client-go's typed clients send them, with tweak applied to their
// options, but without client-go's own retries: those would retry a
// connection that times out or resets ten times, silently, before the
// source hears of it; the source retries itself, and says so.
func listWatch(rc rest.Interface, resource string, newList func() runtime.Object, tweak func(*metav1.ListOptions)) *cache.ListWatch {
	request := func(o *metav1.ListOptions) *rest.Request {
		tweak(o)
		var timeout time.Duration
		if o.TimeoutSeconds != nil {
			timeout = time.Duration(*o.TimeoutSeconds) * time.Second
		}
		return rc.Get().Resource(resource).VersionedParams(o, scheme.ParameterCodec).Timeout(timeout).MaxRetries(0)
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			list := newList()
			err := request(&o).Do(ctx).Into(list)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.Watch = true
			return request(&o).Watch(ctx)
		},
	}
}

// Run starts the informers, calls h.OnSynced once their caches are full,
// and delivers changes until ctx ends. If ctx ends first, Run returns an
// error saying what it was still waiting for, and why. It returns within
// about a second of ctx ending.
func (s *Source) Run(ctx context.Context, h source.Handler) error {
	st := newStatus(s.opts.Log, s.server, h)
	rh := source.Records(h)
	infs := s.informers(st, rh)
	compact := source.NewCompactor()
	var names []string
	for _, inf := range infs {
		if err := inf.informer.SetTransform(compact.Transform); err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", inf.obj.what, err)
		}
		if err := inf.informer.SetWatchErrorHandlerWithContext(s.watchErrorLogger(inf.obj.what)); err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", inf.obj.what, err)
		}
		reg, err := inf.informer.AddEventHandler(inf.handler)
		if err != nil {
			return fmt.Errorf("kubernetes: %s informer: %w", inf.obj.what, err)
		}
		inf.obj.hasSynced = reg.HasSynced
		names = append(names, inf.obj.what)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, inf := range infs {
		wg.Go(func() { inf.informer.RunWithContext(ctx) })
	}
	if c, ok := h.(source.ServiceCIDRHandler); ok {
		wg.Go(func() { s.watchServiceCIDRs(ctx, c) })
	}
	defer func() {
		cancel()
		s.awaitStop(&wg)
	}()
	s.opts.Log.Info("Waiting for the API server's objects", "server", s.server, "objects", strings.Join(names, ", "))
	if err := s.waitSynced(ctx, st); err != nil {
		return err
	}
	rh.OnSynced()
	st.markSynced()
	<-ctx.Done()
	return nil
}

// waitSynced polls until every informer has delivered its initial objects,
// logging now and then what it is still waiting for. It returns an error
// saying so if ctx ends first.
func (s *Source) waitSynced(ctx context.Context, st *status) error {
	start := time.Now()
	// The first sync waits for this: a short poll (three flags to read)
	// starts it soon after the last initial object.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	interval := s.tune.firstReport
	report := start.Add(interval)
	for {
		if st.waitingFor() == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: no objects from the API server at %s after %v; waiting for %s: %w",
				s.server, time.Since(start).Round(100*time.Millisecond), st.waitingFor(), context.Cause(ctx))
		case now := <-poll.C:
			if now.Before(report) {
				continue
			}
			s.opts.Log.Warn("Still waiting for the API server's objects", "server", s.server,
				"waited", now.Sub(start).Round(time.Second), "waitingFor", st.waitingFor())
			interval = min(2*interval, s.tune.maxReport)
			report = now.Add(interval)
		}
	}
}

// awaitStop waits a little for the stopped informers' goroutines, so that
// a stop does not leave them behind, but never long: a client-go wait
// that ignores its context must not hold up a shutdown.
func (s *Source) awaitStop(wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(stopWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.opts.Log.Debug("Informers still stopping; not waiting for them", "waited", stopWait)
	}
}

// watchErrorLogger logs what broke a list or watch the reflector retries
// by itself, keeping its cache; requests that could not reach the API
// server are logged where they are retried.
func (s *Source) watchErrorLogger(what string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		switch {
		case ctx.Err() != nil:
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			s.opts.Log.Debug("Watch of the API server ended; listing again", "objects", what, "error", err)
		default:
			s.opts.Log.Warn("The API server failed a list or watch; retrying, rules unchanged",
				"server", s.server, "objects", what, "error", err)
		}
	}
}

// handlerFor adapts one source.RecordHandler method to informer events.
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
