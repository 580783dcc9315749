package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func TestDropManagedFields(t *testing.T) {
	s := service("web", "1")
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	out, err := dropManagedFields(s)
	if err != nil || out.(*corev1.Service).ManagedFields != nil {
		t.Errorf("managed fields kept: %v, %v", out, err)
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
