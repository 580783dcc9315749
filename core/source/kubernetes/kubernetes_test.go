package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func service(name, rv string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: rv}}
}

func TestHandlerForPassesRealChangesOnly(t *testing.T) {
	var got []string
	h := handlerFor(func(prev, cur *corev1.Service) {
		describe := func(s *corev1.Service) string {
			if s == nil {
				return "-"
			}
			return s.Name + "@" + s.ResourceVersion
		}
		got = append(got, describe(prev)+">"+describe(cur))
	})
	h.OnAdd(service("web", "1"), true)
	h.OnUpdate(service("web", "1"), service("web", "1")) // a relist: nothing changed
	h.OnUpdate(service("web", "1"), service("web", "2"))
	h.OnDelete(service("web", "2"))
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "default/db", Obj: service("db", "7")})
	h.OnAdd(&corev1.Node{}, false) // not a Service: ignored
	want := "->web@1 web@1>web@2 web@2>- db@7>-"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("handler calls %q, want %q", s, want)
	}
}

func TestNewNeedsANodeName(t *testing.T) {
	if _, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, Options{}); err == nil || !strings.Contains(err.Error(), "node name") {
		t.Errorf("New without a node name: %v", err)
	}
}

func TestConfigNamesTheKubeconfig(t *testing.T) {
	_, err := Config("/nonexistent/kubeconfig")
	if err == nil || !strings.Contains(err.Error(), "source.kubeconfig /nonexistent/kubeconfig") {
		t.Errorf("missing kubeconfig: %v", err)
	}
}

// The informers keep, and deliver, objects trimmed by a source.Trimmer:
// what Weir does not read is gone before anything holds it.
func TestDeliveredObjectsAreTrimmed(t *testing.T) {
	f := newFakeAPI(t, 0)
	r := start(t, config(f.srv.URL, defaultLimits))
	r.waitCall("Synced")
	r.rec.mu.Lock()
	svc := r.rec.svc
	r.rec.mu.Unlock()
	switch {
	case svc == nil:
		t.Fatal("no Service delivered")
	case svc.UID != "" || svc.ManagedFields != nil || svc.Annotations != nil || svc.Spec.Selector != nil ||
		svc.Spec.Ports[0].TargetPort != (intstr.IntOrString{}):
		t.Errorf("the Service was not trimmed: %+v", svc)
	case svc.Name != "web" || svc.ResourceVersion != "5" || svc.Spec.ClusterIP != "10.96.0.10" || svc.Spec.Ports[0].Port != 80:
		t.Errorf("the trimmed Service lost what Weir reads: %+v", svc)
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}
