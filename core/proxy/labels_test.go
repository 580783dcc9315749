package proxy_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/proxy"
)

// TestLabelsAsKubeProxysInformersSeeThem checks that the proxy sees
// Services and EndpointSlices as kube-proxy v1.37's informers do
// (cmd/kube-proxy/app/server.go), whatever the source: a Service labelled
// service-proxy-name is left out, a Service labelled headless is proxied,
// an EndpointSlice labelled headless is left out (a label added reads as
// the slice's deletion), an EndpointSlice labelled service-proxy-name is
// used.
func TestLabelsAsKubeProxysInformersSeeThem(t *testing.T) {
	steps := []struct {
		name   string
		change func(p *proxy.Proxy, c cluster)
		// want and notWant are lines the plan must and must not hold.
		want, notWant []string
	}{
		{"a Service labelled headless is proxied", func(p *proxy.Proxy, c cluster) {
			svc := service("tagged", "10.96.0.30", svcPort("http", 80))
			svc.Labels = map[string]string{corev1.IsHeadlessService: ""}
			p.Handler().OnService(nil, svc)
			p.Handler().OnEndpointSlice(nil, endpointSlice("tagged-1", "tagged", ports(epPort("http", 8080)), "10.244.0.31"))
		}, []string{"service default/tagged:http/TCP", "endpoint 10.244.0.31:8080"}, nil},
		{"a Service of another proxy is left out", func(p *proxy.Proxy, c cluster) {
			svc := service("mesh", "10.96.0.40", svcPort("http", 80))
			svc.Labels = map[string]string{planner.LabelServiceProxyName: "mesh-proxy"}
			p.Handler().OnService(nil, svc)
		}, nil, []string{"default/mesh"}},
		{"a slice labelled headless is left out", func(p *proxy.Proxy, c cluster) {
			cur := withAddrs(c.webEPs, "10.244.0.11", "10.244.0.12")
			cur.Labels[corev1.IsHeadlessService] = ""
			p.Handler().OnEndpointSlice(c.webEPs, cur)
		}, []string{"service default/web:http/TCP\n  clusterIP 10.96.0.10 port 80\n  no endpoints: reject"}, []string{"10.244.0.11:8080"}},
		{"a slice labelled for another proxy is used", func(p *proxy.Proxy, c cluster) {
			prev := withAddrs(c.webEPs, "10.244.0.11", "10.244.0.12")
			prev.Labels[corev1.IsHeadlessService] = ""
			cur := withAddrs(prev, "10.244.0.11", "10.244.0.12")
			cur.Labels[planner.LabelServiceProxyName] = "mesh-proxy"
			p.Handler().OnEndpointSlice(prev, cur)
		}, []string{"endpoint 10.244.0.11:8080", "endpoint 10.244.0.12:8080"}, nil},
	}
	p, be, _, c := synced(t)
	for _, s := range steps {
		s.change(p, c)
		if err := p.Sync(context.Background(), false); err != nil {
			t.Fatalf("%s: Sync(partial): %v", s.name, err)
		}
		got := be.last(t).plan.String()
		for _, w := range s.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the plan lacks %q:\n%s", s.name, w, got)
			}
		}
		for _, w := range s.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: the plan holds %q:\n%s", s.name, w, got)
			}
		}
	}
}
