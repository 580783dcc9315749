package difftest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// write creates the scenario's objects through the API: the Node (or an
// update of the one an earlier scenario left), then each Service with its
// load-balancer status, then the EndpointSlices. An object the API server
// refuses is an error naming it: the generator must write valid objects.
func write(ctx context.Context, c kubernetes.Interface, sc *Scenario) error {
	if err := writeNode(ctx, c, sc.Node); err != nil {
		return fmt.Errorf("node %s: %w", sc.Node.Name, err)
	}
	for _, svc := range sc.Services {
		cur, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
		if err == nil && len(svc.Status.LoadBalancer.Ingress) > 0 {
			cur.Status = svc.Status
			_, err = c.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
	}
	for _, sl := range sc.Slices {
		if _, err := c.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("endpointslice %s: %w", sl.Name, err)
		}
	}
	return nil
}

// writeNode creates the Node, or replaces the labels and addresses of the
// one that exists.
func writeNode(ctx context.Context, c kubernetes.Interface, n *corev1.Node) error {
	api := c.CoreV1().Nodes()
	cur, err := api.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, n, metav1.CreateOptions{}) // a Node's status is kept on create
		return err
	}
	if err != nil {
		return err
	}
	cur.Labels = n.Labels
	if cur, err = api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return err
	}
	cur.Status.Addresses = n.Status.Addresses
	_, err = api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}

// clearAll deletes the scenario's Services and EndpointSlices and waits until
// the API server has none of them left.
func clearAll(ctx context.Context, c kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: "endpointslice.kubernetes.io/managed-by=" + managedBy}
	if err := c.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return fmt.Errorf("delete the endpointslices: %w", err)
	}
	list, err := c.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, s := range list.Items {
		if s.Name == "kubernetes" {
			continue
		}
		if err := c.CoreV1().Services(namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete service %s: %w", s.Name, err)
		}
	}
	for {
		l, err := c.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) <= 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the scenario's services are still there: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
