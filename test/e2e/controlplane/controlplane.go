// Package controlplane runs a real Kubernetes control plane for Weir's
// end-to-end tests: etcd, kube-apiserver and kube-controller-manager, built
// from the Go module proxy by hack/controlplane/build.sh (`make
// controlplane`), on loopback with a PKI generated for each test. There is
// no scheduler and no kubelet: tests create Pods bound to a node with
// spec.nodeName and write their status themselves, and the real controllers
// (the EndpointSlice controller above all) do the rest.
//
//	cp := controlplane.Start(t)
//	client := cp.Client // admin, in system:masters
//
// Every process is stopped and every file removed when the test ends; when
// it failed, the end of each process's log is printed.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The cluster's fixed shape.
const (
	// ServiceCIDRs are the service-cluster-ip-range: dual-stack, IPv4 first.
	ServiceCIDRs = "10.96.0.0/16,fd00:10:96::/112"
	// Issuer is the service-account token issuer.
	Issuer = "https://kubernetes.default.svc.cluster.local"
	// advertiseAddress is what kube-apiserver writes into the kubernetes
	// Service's endpoints. It must not be loopback (endpoints may not be),
	// and nothing connects to it: a documentation address (RFC 5737).
	advertiseAddress = "192.0.2.1"
)

// Controllers are the kube-controller-manager controllers the control plane
// runs: what a proxy's view of the cluster needs, without nodes' lifecycle
// (no node, IPAM or pod garbage collection: tests own their Nodes and Pods).
var Controllers = []string{
	"clusterrole-aggregation-controller", // fills view, edit and admin
	"endpointslice-controller",
	"endpointslice-mirroring-controller",
	"serviceaccount-controller",
	"namespace-controller",
	"garbage-collector-controller",
	"root-ca-certificate-publisher-controller",
}

// Timeouts of the start and of each wait for readiness.
const (
	readyTimeout = 2 * time.Minute
	pollInterval = 100 * time.Millisecond
)

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
type ControlPlane struct {
	// Dir is the test's folder for the PKI, kubeconfigs, etcd's data and the
	// processes' logs (<name>.log).
	Dir string
	// Server is kube-apiserver's URL, https://127.0.0.1:<port>.
	Server string
	// Kubeconfig is the path of the admin's kubeconfig (in system:masters).
	Kubeconfig string
	// Config is the admin's client configuration.
	Config *rest.Config
	// Client is a clientset on Config.
	Client kubernetes.Interface
	// StartDuration is how long Start took until every part was ready.
	StartDuration time.Duration

	bins          Binaries
	apiserverArgs []string
	etcdURL       string

	mu        sync.Mutex // guards pki (serial numbers) and the processes
	pki       *pki
	etcd      *process
	apiserver *process
	kcm       *process
}

// Start runs a control plane for t and stops it when t ends. It skips t
// when the binaries are missing (fails under CI=true: see RequireBinaries)
// and fails t when any part does not become ready within its deadline.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	bins := RequireBinaries(t)
	begin := time.Now()
	cp := &ControlPlane{Dir: t.TempDir(), bins: bins}
	t.Cleanup(func() { cp.stop(t) })
	if err := cp.start(t); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	cp.StartDuration = time.Since(begin)
	t.Logf("control plane ready in %v at %s (logs in %s)", cp.StartDuration.Round(time.Millisecond), cp.Server, cp.Dir)
	return cp
}

// start generates the PKI and kubeconfigs and starts the three processes,
// each once the one before is ready.
func (cp *ControlPlane) start(t testing.TB) error {
	var err error
	if cp.pki, err = newPKI(filepath.Join(cp.Dir, "pki")); err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	cp.Server = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	if err := cp.writeKubeconfigs(); err != nil {
		return err
	}

	step := time.Now()
	if err := cp.startEtcd(etcdPort, peerPort); err != nil {
		return err
	}
	t.Logf("etcd ready in %v", time.Since(step).Round(time.Millisecond))

	cp.apiserverArgs = cp.apiServerFlags(apiPort)
	step = time.Now()
	if err := cp.startAPIServer(); err != nil {
		return err
	}
	t.Logf("kube-apiserver ready in %v", time.Since(step).Round(time.Millisecond))

	step = time.Now()
	if err := cp.startControllerManager(); err != nil {
		return err
	}
	t.Logf("kube-controller-manager ready in %v", time.Since(step).Round(time.Millisecond))
	return nil
}

// startEtcd runs a single-member etcd on loopback with its data in Dir and
// waits for its /health.
func (cp *ControlPlane) startEtcd(clientPort, peerPort int) error {
	cp.etcdURL = "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := startProcess("etcd", cp.bins.Etcd, cp.logPath("etcd"),
		"--name=weir-e2e",
		"--data-dir="+filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls="+cp.etcdURL,
		"--advertise-client-urls="+cp.etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=weir-e2e="+peerURL,
		"--unsafe-no-fsync", // a test's data need not survive a power cut
	)
	if err != nil {
		return err
	}
	cp.setProcess(&cp.etcd, p)
	return waitFor("etcd /health", p, func(ctx context.Context) (bool, error) {
		body, code, err := httpGet(ctx, cp.etcdURL+"/health")
		return err == nil && code == http.StatusOK && strings.Contains(body, `"health":"true"`), nil
	})
}

// apiServerFlags are kube-apiserver's flags, the same at every (re)start.
func (cp *ControlPlane) apiServerFlags(port int) []string {
	pki := cp.pki.path
	return []string{
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--advertise-address=" + advertiseAddress,
		"--etcd-servers=" + cp.etcdURL,
		"--service-cluster-ip-range=" + ServiceCIDRs,
		"--client-ca-file=" + pki(caCertFile),
		"--tls-cert-file=" + pki(servingCert),
		"--tls-private-key-file=" + pki(servingKey),
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--service-account-issuer=" + Issuer,
		"--service-account-key-file=" + pki(saPubFile),
		"--service-account-signing-key-file=" + pki(saKeyFile),
		"--authorization-mode=Node,RBAC",
		"--profiling=false",
		// Stop within seconds: by default the HTTP server waits the
		// request timeout (60 s) for open watches when it shuts down.
		"--shutdown-send-retry-after=true",
		"--v=2",
	}
}

// startAPIServer runs kube-apiserver and waits until its /readyz answers ok
// to the admin.
func (cp *ControlPlane) startAPIServer() error {
	p, err := startProcess("kube-apiserver", cp.bins.APIServer, cp.logPath("kube-apiserver"), cp.apiserverArgs...)
	if err != nil {
		return err
	}
	cp.setProcess(&cp.apiserver, p)
	return waitFor("kube-apiserver /readyz", p, func(ctx context.Context) (bool, error) {
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// startControllerManager runs kube-controller-manager with its own client
// certificate (each controller then acts as its own service account, as in
// a kubeadm cluster) and waits until its service-account controller has
// created the default namespace's "default" ServiceAccount, which creating
// a Pod there needs.
func (cp *ControlPlane) startControllerManager() error {
	p, err := startProcess("kube-controller-manager", cp.bins.ControllerManager, cp.logPath("kube-controller-manager"),
		"--kubeconfig="+filepath.Join(cp.Dir, "controller-manager.kubeconfig"),
		"--secure-port=0",
		"--controllers="+strings.Join(Controllers, ","),
		"--use-service-account-credentials=true",
		"--root-ca-file="+cp.pki.path(caCertFile),
		"--service-cluster-ip-range="+ServiceCIDRs,
		// Without leader election, an outage of kube-apiserver does not
		// make the controller manager exit.
		"--leader-elect=false",
		"--v=2",
	)
	if err != nil {
		return err
	}
	cp.setProcess(&cp.kcm, p)
	return waitFor("kube-controller-manager (ServiceAccount default/default)", p, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// StopAPIServer stops kube-apiserver, leaving etcd and the controller
// manager running: the cluster's API is down until StartAPIServer.
func (cp *ControlPlane) StopAPIServer(t testing.TB) {
	t.Helper()
	cp.mu.Lock()
	p := cp.apiserver
	cp.mu.Unlock()
	if err := p.stop(); err != nil {
		t.Errorf("stop kube-apiserver: %v", err)
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port with the same flags, and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(t testing.TB) {
	t.Helper()
	cp.mu.Lock()
	running := cp.apiserver
	cp.mu.Unlock()
	if done, _ := running.exited(); !done {
		t.Fatal("StartAPIServer: kube-apiserver is running; StopAPIServer first")
	}
	begin := time.Now()
	if err := cp.startAPIServer(); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver ready again in %v", time.Since(begin).Round(time.Millisecond))
}

// RestartAPIServer is StopAPIServer then StartAPIServer.
func (cp *ControlPlane) RestartAPIServer(t testing.TB) {
	t.Helper()
	cp.StopAPIServer(t)
	cp.StartAPIServer(t)
}

// setProcess records p in *slot under the lock.
func (cp *ControlPlane) setProcess(slot **process, p *process) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	*slot = p
}

// stop ends every process, the newest first, and prints their logs when the
// test failed.
func (cp *ControlPlane) stop(t testing.TB) {
	cp.mu.Lock()
	procs := []*process{cp.kcm, cp.apiserver, cp.etcd}
	cp.mu.Unlock()
	for _, p := range procs {
		if p == nil {
			continue
		}
		if err := p.stop(); err != nil {
			t.Logf("%v", err)
		}
	}
	if !t.Failed() {
		return
	}
	for _, p := range procs {
		if p != nil {
			t.Logf("--- %s log (%s) ---\n%s", p.name, p.log, p.tail())
		}
	}
}

// logPath is the log file of the process name.
func (cp *ControlPlane) logPath(name string) string {
	return filepath.Join(cp.Dir, name+".log")
}

// waitFor polls ready until it reports true, p exits or readyTimeout
// passes, whichever comes first; an error from ready ends the wait.
func waitFor(what string, p *process, ready func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("waiting for %s: %w (its log: %s)", what, err, p.log)
		}
		attempt, cancelAttempt := context.WithTimeout(ctx, 5*time.Second)
		ok, err := ready(attempt)
		cancelAttempt()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v", what, readyTimeout)
		case <-p.done:
		case <-tick.C:
		}
	}
}

// httpGet is a plain GET of url: body and status code.
func httpGet(ctx context.Context, url string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b), resp.StatusCode, err
}

// freePorts are n distinct TCP ports free on 127.0.0.1 at the time of the
// call, found by listening on port 0; the listeners are all open at once so
// the ports differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	var errs []error
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			errs = append(errs, err)
			break
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("free ports: %w", errors.Join(errs...))
	}
	return ports, nil
}

// CreateNamespace creates the namespace name and waits until the
// controller manager has created its "default" ServiceAccount, without
// which no Pod can be created in it. The namespace goes when t ends.
func (cp *ControlPlane) CreateNamespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := cp.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !isDown(err) {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	err := waitFor("ServiceAccount "+name+"/default", cp.kcm, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// isDown reports whether err says the API could not be reached, as at the
// end of a test that stopped kube-apiserver.
func isDown(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, os.ErrDeadlineExceeded)
}
