package soak

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/netns"
	"github.com/weirproxy/weir/test/programt"
)

// The cluster's names and ports.
const (
	nodeName  = "soak-node"  // the Node Weir runs as
	otherNode = "soak-other" // a Node without Weir: endpoints on it are not local
	podPort   = 8080         // every pod answers its name on it (TCP and UDP)
	echoPort  = 9090         // the held pods echo on it, for long-lived connections
	heldNS    = "soak-held"  // the namespace of the held service, never churned
)

// namespaces are where churned services live.
var namespaces = []string{"soak-a", "soak-b"}

// cluster is the control plane, the node and its pods.
type cluster struct {
	cp     *controlplane.ControlPlane
	client kubernetes.Interface // admin, with a rate limit fit for churn
	topo   *netns.Topology
	pods   []*netns.Pod
	fwd    *netns.Forwarder
	// kubeconfig authenticates as Weir's ServiceAccount, bound only by
	// deploy/kubernetes's RBAC.
	kubeconfig string
	echo       []*netns.Echo
}

// startCluster starts the control plane, applies Weir's RBAC, creates the
// Nodes, namespaces and pod namespaces, and forwards the API server into
// the node; with the files source, only the pod namespaces. Everything is
// undone by t's cleanups.
func startCluster(ctx context.Context, t *programt.T, cfg *Config) (*cluster, error) {
	c := &cluster{}
	if cfg.Source == "files" {
		return c, c.startTopology(t, cfg.Pods)
	}
	var err error
	if err = programt.Catch(func() { c.cp = controlplane.Start(t) }); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(c.cp.Config)
	rc.QPS, rc.Burst = 200, 400
	rc.WarningHandler = rest.NoWarnings{} // externalIPs are deprecated, and used on purpose
	if c.client, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if err := applyRBAC(ctx, c.client, cfg.Repo); err != nil {
		return nil, err
	}
	if err := programt.Catch(func() {
		c.kubeconfig = c.cp.KubeconfigForServiceAccount(t, "kube-system", "weir")
	}); err != nil {
		return nil, err
	}
	if err := c.startTopology(t, cfg.Pods); err != nil {
		return nil, err
	}
	for _, n := range []struct {
		name string
		ips  []netip.Addr
	}{{nodeName, []netip.Addr{c.topo.NodeIP, c.topo.NodeIP6}}, {otherNode, []netip.Addr{netip.MustParseAddr("192.0.2.200")}}} {
		if err := createNode(ctx, c.client, n.name, n.ips...); err != nil {
			return nil, err
		}
	}
	for _, ns := range append([]string{heldNS}, namespaces...) {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	u, err := url.Parse(c.cp.Server)
	if err != nil {
		return nil, err
	}
	if c.fwd, err = netns.Forward(c.topo.Node, u.Host); err != nil {
		return nil, fmt.Errorf("forward the API server into the node: %w", err)
	}
	t.Cleanup(c.fwd.Close)
	return c, nil
}

// startTopology builds the node, client and pod namespaces; every pod is
// dual-stack and the first two also echo on echoPort.
func (c *cluster) startTopology(t *programt.T, pods int) error {
	var err error
	if c.topo, err = netns.New(netns.Options{}); err != nil {
		return fmt.Errorf("netns topology: %w", err)
	}
	t.Cleanup(func() {
		if err := c.topo.Close(); err != nil {
			t.Logf("close the netns topology: %v", err)
		}
	})
	ip, ip6 := netns.DefaultPodCIDR.Addr(), netns.DefaultPodCIDR6.Addr()
	for i := range pods {
		ip, ip6 = ip.Next(), ip6.Next()
		p, err := c.topo.AddPod(netns.PodSpec{Name: fmt.Sprintf("p%d", i), IP: ip, IP6: ip6, Ports: []uint16{podPort}})
		if err != nil {
			return err
		}
		c.pods = append(c.pods, p)
		if i < 2 {
			e, err := netns.StartEcho(p, echoPort)
			if err != nil {
				return err
			}
			t.Cleanup(e.Close)
			c.echo = append(c.echo, e)
		}
	}
	return nil
}

// createNode creates a Node with ips as its InternalIP addresses.
func createNode(ctx context.Context, client kubernetes.Interface, name string, ips ...netip.Addr) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status:     corev1.NodeStatus{Addresses: internalIPs(ips)},
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

// internalIPs lists ips as a Node's InternalIP addresses: its primary IPs,
// where mode nftables serves node ports by default, one per family.
func internalIPs(ips []netip.Addr) []corev1.NodeAddress {
	out := make([]corev1.NodeAddress, 0, len(ips))
	for _, ip := range ips {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	return out
}

// applyRBAC creates the ServiceAccount, ClusterRole and ClusterRoleBinding
// of deploy/kubernetes, as an operator installing Weir would.
func applyRBAC(ctx context.Context, client kubernetes.Interface, repo string) error {
	var docs []string
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		raw, err := os.ReadFile(filepath.Join(repo, "deploy", "kubernetes", f))
		if err != nil {
			return err
		}
		docs = append(docs, strings.Split(string(raw), "\n---\n")...)
	}
	for _, doc := range docs {
		if err := applyRBACDoc(ctx, client, []byte(doc)); err != nil {
			return err
		}
	}
	return nil
}

func applyRBACDoc(ctx context.Context, client kubernetes.Interface, doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	var err error
	switch meta.Kind {
	case "ServiceAccount":
		var o corev1.ServiceAccount
		if err = yaml.UnmarshalStrict(doc, &o); err == nil {
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		}
	case "ClusterRole":
		var o rbacv1.ClusterRole
		if err = yaml.UnmarshalStrict(doc, &o); err == nil {
			_, err = client.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		}
	case "ClusterRoleBinding":
		var o rbacv1.ClusterRoleBinding
		if err = yaml.UnmarshalStrict(doc, &o); err == nil {
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
		}
	case "":
		return nil // comments only
	default:
		return fmt.Errorf("deploy/kubernetes: kind %q in the RBAC files: teach the soak about it", meta.Kind)
	}
	if err != nil {
		return fmt.Errorf("apply %s from deploy/kubernetes: %w", meta.Kind, err)
	}
	return nil
}
