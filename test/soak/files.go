package soak

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/netns"
)

// filesStore writes the model as a folder of manifests for the files
// source: one file per service holding the Service and its slices, each
// written whole through a rename. It allocates what the API server
// would: cluster IPs and node ports, unique unless a conflict asks for a
// taken one, which only a folder of manifests can hold.
type filesStore struct {
	dir    string
	pods   []*netns.Pod
	writes int

	nextIP    int
	nodePorts map[int32]bool // in use
	nextPort  int32
}

func newFilesStore(dir string, pods []*netns.Pod) *filesStore {
	return &filesStore{dir: dir, pods: pods, nodePorts: map[int32]bool{}, nextPort: 30000}
}

func (f *filesStore) writeCount() int { return f.writes }

func (f *filesStore) path(s *service) string {
	return filepath.Join(f.dir, s.ns+"."+s.name+".yaml")
}

// writeNode writes the Node Weir runs as, with its addresses.
func (f *filesStore) writeNode(ips ...netip.Addr) error {
	node := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}},
		Status:     corev1.NodeStatus{Addresses: internalIPs(ips)},
	}
	b, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	return f.write(filepath.Join(f.dir, "node.yaml"), b)
}

// write replaces the file at path through a hidden temporary file.
func (f *filesStore) write(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	f.writes++
	return os.Rename(tmp, path)
}

// save writes the service's file from the model.
func (f *filesStore) save(s *service) error {
	docs := make([][]byte, 0, 1+len(s.slices))
	svc := s.obj.DeepCopy()
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	b, err := yaml.Marshal(svc)
	if err != nil {
		return err
	}
	docs = append(docs, b)
	for _, sl := range s.slices {
		obj := sliceObject(f.pods, s, sl)
		obj.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		obj.ResourceVersion = ""
		if b, err = yaml.Marshal(obj); err != nil {
			return err
		}
		docs = append(docs, b)
	}
	var text strings.Builder
	for i, d := range docs {
		if i > 0 {
			text.WriteString("---\n")
		}
		text.Write(d)
	}
	if err := f.write(f.path(s), []byte(text.String())); err != nil {
		return fmt.Errorf("write %s: %w", f.path(s), err)
	}
	s.lastWrite = time.Now()
	return nil
}

func (f *filesStore) createService(ctx context.Context, s *service) error {
	obj := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns,
		CreationTimestamp: metav1.NewTime(time.Now().Truncate(time.Second))}}
	ips := []netip.Addr{f.clusterIP(4)}
	if s.dual {
		ips = append(ips, f.clusterIP(6))
	}
	if s.forceClusterIP.IsValid() {
		ips[0] = s.forceClusterIP
	}
	for _, ip := range ips {
		obj.Spec.ClusterIPs = append(obj.Spec.ClusterIPs, ip.String())
	}
	obj.Spec.ClusterIP = obj.Spec.ClusterIPs[0]
	s.obj = obj
	f.allocate(s)
	return f.save(s)
}

func (f *filesStore) updateService(ctx context.Context, s *service) error {
	f.allocate(s)
	return f.save(s)
}

// allocate applies the model's spec to the stored object, gives every port
// a node port when the type needs them (keeping the ones it has) and
// releases the ones it no longer needs, and writes the load-balancer
// status.
func (f *filesStore) allocate(s *service) {
	old := map[string]int32{}
	for _, p := range s.obj.Spec.Ports {
		old[p.Name] = p.NodePort
	}
	oldHC := s.obj.Spec.HealthCheckNodePort
	s.applySpec(s.obj)
	spec := &s.obj.Spec
	kept := map[int32]bool{}
	for i := range spec.Ports {
		p := &spec.Ports[i]
		switch {
		case s.kind == corev1.ServiceTypeClusterIP:
		case s.forceNodePort != 0 && i == 0:
			p.NodePort = s.forceNodePort
		case old[p.Name] != 0:
			p.NodePort = old[p.Name]
		default:
			p.NodePort = f.nodePort()
		}
		kept[p.NodePort] = true
	}
	spec.HealthCheckNodePort = 0
	if s.kind == corev1.ServiceTypeLoadBalancer && s.etpLocal {
		spec.HealthCheckNodePort = oldHC
		if oldHC == 0 {
			spec.HealthCheckNodePort = f.nodePort()
		}
	}
	kept[spec.HealthCheckNodePort] = true
	for _, np := range append(mapsValues(old), oldHC) {
		if !kept[np] && (s.forceNodePort == 0 || np != s.forceNodePort) {
			delete(f.nodePorts, np)
		}
	}
	s.obj.Status = corev1.ServiceStatus{}
	if s.kind == corev1.ServiceTypeLoadBalancer && s.lbIP.IsValid() {
		s.obj.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.lbIP.String()}}
	}
}

func mapsValues(m map[string]int32) []int32 {
	out := make([]int32, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// clusterIP allocates the next cluster IP of family, in the control
// plane's service range.
func (f *filesStore) clusterIP(family int) netip.Addr {
	f.nextIP++
	n := f.nextIP%65000 + 2
	if family == 6 {
		b := netip.MustParseAddr("fd00:10:96::").As16()
		b[14], b[15] = byte(n>>8), byte(n)
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{10, 96, byte(n >> 8), byte(n)})
}

// nodePort allocates a free node port of 30000-32767.
func (f *filesStore) nodePort() int32 {
	for {
		p := f.nextPort
		f.nextPort++
		if f.nextPort > 32767 {
			f.nextPort = 30000
		}
		if !f.nodePorts[p] {
			f.nodePorts[p] = true
			return p
		}
	}
}

func (f *filesStore) deleteService(ctx context.Context, s *service) error {
	err := os.Remove(f.path(s))
	f.writes++
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, p := range s.obj.Spec.Ports {
		if p.NodePort != s.forceNodePort {
			delete(f.nodePorts, p.NodePort)
		}
	}
	delete(f.nodePorts, s.obj.Spec.HealthCheckNodePort)
	s.lastWrite = time.Now()
	return nil
}

func (f *filesStore) createSlice(ctx context.Context, s *service, sl *slice) error { return f.save(s) }

func (f *filesStore) updateSlice(ctx context.Context, s *service, sl *slice) error { return f.save(s) }

func (f *filesStore) deleteSlice(ctx context.Context, s *service, sl *slice) error { return f.save(s) }

func (f *filesStore) purge(ctx context.Context, s *service) error { return f.deleteService(ctx, s) }
