//go:build e2e

package controlplane

import (
	"context"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// clientFor is a clientset on the kubeconfig at path.
func clientFor(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := ConfigFromKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// whoAmI is the user name the API server sees for c.
func whoAmI(ctx context.Context, t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo.Username
}

// TestHelpers checks the kubeconfig helpers' identities, RBAC's say over
// them, a fresh namespace, and a restart of kube-apiserver that keeps the
// cluster's state and the controllers working.
func TestHelpers(t *testing.T) {
	cp := Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// A user with a certificate but no role may authenticate, nothing more.
	alice := clientFor(t, cp.KubeconfigForUser(t, "alice", "weir-testers"))
	if got := whoAmI(ctx, t, alice); got != "alice" {
		t.Errorf("user kubeconfig authenticates as %q, want alice", got)
	}
	if _, err := alice.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice lists services without a role: err = %v, want forbidden", err)
	}

	cp.CreateNamespace(t, "weir")
	sa := clientFor(t, cp.KubeconfigForServiceAccount(t, "weir", "weir"))
	if got, want := whoAmI(ctx, t, sa), "system:serviceaccount:weir:weir"; got != want {
		t.Errorf("service-account kubeconfig authenticates as %q, want %q", got, want)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "weir-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "weir", Namespace: "weir"}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC's authorizer learns of the binding through its informer, and the
	// aggregation controller fills "view".
	var listErr error
	err := waitFor("RBAC binding for weir", cp.apiserver, func(ctx context.Context) (bool, error) {
		_, listErr = sa.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return listErr == nil, nil
	})
	if err != nil {
		t.Fatalf("%v: %v", err, listErr)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "weir"}}
	if _, err := cp.Client.CoreV1().ConfigMaps("weir").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.StopAPIServer(t)
	if _, err := cp.Client.CoreV1().ConfigMaps("weir").Get(ctx, "kept", metav1.GetOptions{}); err == nil {
		t.Error("the API answers while kube-apiserver is stopped")
	}
	cp.StartAPIServer(t)
	if _, err := cp.Client.CoreV1().ConfigMaps("weir").Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	// The controller manager reconnects: a new namespace gets its account.
	cp.CreateNamespace(t, "after-restart")
}
