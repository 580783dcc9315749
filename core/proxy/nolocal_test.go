package proxy_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirproxy/weir/core/metrics"
)

// noLocalCluster is the cluster of TestNoLocalEndpoints: itp is a
// dual-stack service with internalTrafficPolicy Local whose IPv4 endpoint
// runs on another node and whose IPv6 endpoint runs on n1; etp a NodePort
// service with externalTrafficPolicy Local whose endpoint runs elsewhere;
// empty has internalTrafficPolicy Local and no endpoints at all, which
// kube-proxy does not count.
type noLocalCluster struct {
	itp, etp, empty              *corev1.Service
	itpV4, itpV6, etpEPs, emptyE *discoveryv1.EndpointSlice
}

func newNoLocalCluster() noLocalCluster {
	local := corev1.ServiceInternalTrafficPolicyLocal
	c := noLocalCluster{
		itp:   service("itp", "10.96.0.30", svcPort("http", 80)),
		etp:   service("etp", "10.96.0.31", svcPort("http", 80)),
		empty: service("empty", "10.96.0.32", svcPort("http", 80)),
	}
	c.itp.Spec.ClusterIPs = []string{"10.96.0.30", "fd00:96::30"}
	c.itp.Spec.InternalTrafficPolicy = &local
	c.empty.Spec.InternalTrafficPolicy = &local
	c.etp.Spec.Type, c.etp.Spec.ExternalTrafficPolicy = corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal
	c.etp.Spec.Ports[0].NodePort = 30080
	c.itpV4 = onNode(endpointSlice("itp-v4", "itp", ports(epPort("http", 8080)), "10.244.1.30"), "n2")
	c.itpV6 = endpointSlice("itp-v6", "itp", ports(epPort("http", 8080)), "fd00:244::30")
	c.itpV6.AddressType = discoveryv1.AddressTypeIPv6
	c.etpEPs = onNode(endpointSlice("etp-1", "etp", ports(epPort("http", 8080)), "10.244.1.31"), "n2")
	c.emptyE = endpointSlice("empty-1", "empty", ports(epPort("http", 8080)))
	return c
}

// onNode moves every endpoint of s to node.
func onNode(s *discoveryv1.EndpointSlice, node string) *discoveryv1.EndpointSlice {
	for i := range s.Endpoints {
		s.Endpoints[i].NodeName = &node
	}
	return s
}

// noLocal checks the four series of the gauge.
func (o *observed) noLocal(t *testing.T, step string, v4Internal, v4External, v6Internal, v6External float64) {
	t.Helper()
	const name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
	o.want(t, step, name, v4Internal, "ip_family", metrics.IPv4, "traffic_policy", "internal")
	o.want(t, step, name, v4External, "ip_family", metrics.IPv4, "traffic_policy", "external")
	o.want(t, step, name, v6Internal, "ip_family", metrics.IPv6, "traffic_policy", "internal")
	o.want(t, step, name, v6External, "ip_family", metrics.IPv6, "traffic_policy", "external")
}

// TestNoLocalEndpoints follows sync_proxy_rules_no_local_endpoints_total:
// the services with a Local policy and endpoints, none of them on this
// node, per family, as kube-proxy counts them. The gauge changes only once
// a commit succeeded; partial syncs update the services they touch and
// leave the others counted; a deleted service leaves it.
func TestNoLocalEndpoints(t *testing.T) {
	o := newObserved(t)
	c := newNoLocalCluster()
	h := o.p.Handler()
	h.OnNode(nil, node("n1"))
	for _, s := range []*corev1.Service{c.itp, c.etp, c.empty} {
		h.OnService(nil, s)
	}
	for _, s := range []*discoveryv1.EndpointSlice{c.itpV4, c.itpV6, c.etpEPs, c.emptyE} {
		h.OnEndpointSlice(nil, s)
	}
	h.OnSynced()
	mustSync(t, o, true)
	o.noLocal(t, "after the first sync", 1, 1, 0, 0)

	// A local IPv4 endpoint for itp, in a commit that fails: nothing changes.
	itpV4 := withAddrs(c.itpV4, "10.244.0.30")
	h.OnEndpointSlice(c.itpV4, itpV4)
	o.be.failNextSync(errors.New("kernel says no"))
	if err := o.p.Sync(t.Context(), false); err == nil {
		t.Fatal("the sync did not fail")
	}
	o.noLocal(t, "after a failed commit", 1, 1, 0, 0)
	mustSync(t, o, false) // the retry is full
	o.noLocal(t, "after the retry", 0, 1, 0, 0)

	// Partial syncs: etp gets a local endpoint, then itp loses its own.
	etpEPs := withAddrs(c.etpEPs, "10.244.0.31")
	h.OnEndpointSlice(c.etpEPs, etpEPs)
	mustPartialSync(t, o)
	o.noLocal(t, "after etp got a local endpoint", 0, 0, 0, 0)
	h.OnEndpointSlice(itpV4, onNode(withAddrs(itpV4, "10.244.1.30"), "n2"))
	mustPartialSync(t, o)
	o.noLocal(t, "after itp lost its local endpoint", 1, 0, 0, 0)

	// etp's policy becomes Cluster: it no longer counts; itp still does.
	etp := c.etp.DeepCopy()
	etp.ResourceVersion, etp.Spec.ExternalTrafficPolicy = "2", corev1.ServiceExternalTrafficPolicyCluster
	h.OnService(c.etp, etp)
	mustPartialSync(t, o)
	o.noLocal(t, "after etp's policy became Cluster", 1, 0, 0, 0)

	h.OnService(c.itp, nil)
	mustPartialSync(t, o)
	o.noLocal(t, "after itp was deleted", 0, 0, 0, 0)
}

func mustSync(t *testing.T, o *observed, full bool) {
	t.Helper()
	if err := o.p.Sync(t.Context(), full); err != nil {
		t.Fatal(err)
	}
}

// mustPartialSync syncs the changes and checks the backend saw a partial
// sync.
func mustPartialSync(t *testing.T, o *observed) {
	t.Helper()
	mustSync(t, o, false)
	if o.be.last(t).full() {
		t.Fatal("the sync was full, want partial")
	}
}
