package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// tokenLifetime is the lifetime of the service-account tokens the helpers
// request: longer than any test.
const tokenLifetime = 2 * time.Hour

// writeKubeconfigs writes the admin's and the controller manager's
// kubeconfigs and builds the admin's client from the first.
func (cp *ControlPlane) writeKubeconfigs() error {
	p := cp.pki
	admin := &clientcmdapi.AuthInfo{ClientCertificate: p.path(adminCertFile), ClientKey: p.path(adminKeyFile)}
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := cp.writeKubeconfig(cp.Kubeconfig, adminUser, admin); err != nil {
		return err
	}
	kcm := &clientcmdapi.AuthInfo{ClientCertificate: p.path(kcmCertFile), ClientKey: p.path(kcmKeyFile)}
	if err := cp.writeKubeconfig(filepath.Join(cp.Dir, "controller-manager.kubeconfig"), kcmUser, kcm); err != nil {
		return err
	}
	cfg, err := ConfigFromKubeconfig(cp.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cp.Config, cp.Client = cfg, client
	return nil
}

// writeKubeconfig writes a kubeconfig for the control plane's server and CA
// in which user authenticates with auth.
func (cp *ControlPlane) writeKubeconfig(path, user string, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["weir-e2e"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["weir-e2e"] = &clientcmdapi.Context{Cluster: "weir-e2e", AuthInfo: user}
	cfg.CurrentContext = "weir-e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

// ConfigFromKubeconfig is the client configuration of a kubeconfig file.
func ConfigFromKubeconfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// unsafeName matches what may not appear in a kubeconfig's file name.
var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// kubeconfigPath is a fresh kubeconfig's path in Dir for name.
func (cp *ControlPlane) kubeconfigPath(name string) string {
	return filepath.Join(cp.Dir, unsafeName.ReplaceAllString(name, "_")+".kubeconfig")
}

// KubeconfigForUser writes a kubeconfig in which user, in groups,
// authenticates with a client certificate of the control plane's CA, and
// returns its path. What user may do is up to RBAC: the test binds roles.
func (cp *ControlPlane) KubeconfigForUser(t testing.TB, user string, groups ...string) string {
	t.Helper()
	cp.mu.Lock()
	certPEM, keyPEM, err := cp.pki.issue(clientTemplate(user, groups))
	cp.mu.Unlock()
	if err != nil {
		t.Fatalf("client certificate for %s: %v", user, err)
	}
	path := cp.kubeconfigPath("user-" + user)
	auth := &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	if err := cp.writeKubeconfig(path, user, auth); err != nil {
		t.Fatalf("kubeconfig for %s: %v", user, err)
	}
	return path
}

// KubeconfigForToken writes a kubeconfig that authenticates with a bearer
// token, named name, and returns its path.
func (cp *ControlPlane) KubeconfigForToken(t testing.TB, name, token string) string {
	t.Helper()
	path := cp.kubeconfigPath("token-" + name)
	if err := cp.writeKubeconfig(path, name, &clientcmdapi.AuthInfo{Token: token}); err != nil {
		t.Fatalf("kubeconfig for %s: %v", name, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServiceAccountToken creates the ServiceAccount namespace/name unless it
// exists and returns a token for it from the TokenRequest API.
func (cp *ControlPlane) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sas := cp.Client.CoreV1().ServiceAccounts(namespace)
	if _, err := sas.Get(ctx, name, metav1.GetOptions{}); err != nil {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
		if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ServiceAccount %s/%s: %v", namespace, name, err)
		}
	}
	seconds := int64(tokenLifetime / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	tr, err := sas.CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// KubeconfigForServiceAccount writes a kubeconfig that authenticates as the
// ServiceAccount namespace/name (created unless it exists), as a pod of it
// would, and returns its path.
func (cp *ControlPlane) KubeconfigForServiceAccount(t testing.TB, namespace, name string) string {
	t.Helper()
	token := cp.ServiceAccountToken(t, namespace, name)
	return cp.KubeconfigForToken(t, "system:serviceaccount:"+namespace+":"+name, token)
}
