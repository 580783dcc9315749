// Package scale generates large clusters as Kubernetes manifests, one file
// per service, for benchmarks of the whole pipeline.
package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// maxNodePorts is how many services get a node port (the default NodePort
// range holds 2768 ports).
const maxNodePorts = 2700

// narrow is the most endpoints per service addressed the original way;
// wider services take their addresses from another range.
const narrow = 16

// SliceSize is how many endpoints one EndpointSlice of a wider service
// holds: the EndpointSlice controller's default --max-endpoints-per-slice.
const SliceSize = 100

// Manifest returns service i's manifest: a Service in namespace "bench" and
// its EndpointSlices with eps endpoints on nodes node-0..2 (the benchmarks
// run as node-0). Services mix the types an operator runs: of every ten,
// five are ClusterIP (one with ClientIP affinity), three NodePort and two
// LoadBalancer with an ingress IP and source ranges, one of them with
// externalTrafficPolicy Local. Node ports run out after 2700; later
// NodePort services become ClusterIP and later load balancers get none. A
// non-zero version moves the first endpoint to another address, so
// successive versions are one-endpoint changes.
//
// Up to 16 endpoints, a service has one slice and its endpoints are at
// 10.(128+i/4096).x.y, unique across services up to a million of them;
// wider ones have slices of SliceSize endpoints at addresses numbered
// i×eps+j from 10.160.0.0, unique across the cluster up to six million
// endpoints in all.
func Manifest(i, eps, version int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-%d\n  namespace: bench\nspec:\n", i)
	b.WriteString(serviceSpec(i))
	for s := 0; s == 0 || s*SliceSize < eps; s++ {
		n := eps
		if eps > narrow {
			n = min(SliceSize, eps-s*SliceSize)
		}
		writeSlice(&b, i, s, eps, n, version)
	}
	return []byte(b.String())
}

// writeSlice writes slice s of service i: its n endpoints from the
// (s×SliceSize)th.
func writeSlice(b *strings.Builder, i, s, eps, n, version int) {
	name := "abcde"
	if s > 0 {
		name = fmt.Sprintf("s%04d", s)
	}
	fmt.Fprintf(b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%d-%s
  namespace: bench
  labels:
    kubernetes.io/service-name: svc-%d
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
`, i, name, i)
	for k := range n {
		j := s*SliceSize + k
		addr := endpointAddr(i, j, eps)
		if j == 0 && version > 0 {
			addr = fmt.Sprintf("10.%d.%d.%d", 192+version%64, (i>>8)&255, i&255)
		}
		fmt.Fprintf(b, "- addresses: [%q]\n  conditions: {ready: true}\n  nodeName: node-%d\n", addr, j%3)
	}
}

// endpointAddr returns the address of endpoint j of service i of a
// cluster whose services have eps endpoints each.
func endpointAddr(i, j, eps int) string {
	if eps <= narrow {
		return fmt.Sprintf("10.%d.%d.%d", 128+i>>12, (i>>4)&255, (i&15)<<4+j)
	}
	a := i*eps + j
	return fmt.Sprintf("10.%d.%d.%d", 160+a>>16, (a>>8)&255, a&255)
}

// serviceSpec returns the spec (and status) lines of service i.
func serviceSpec(i int) string {
	kind := i % 10
	var b strings.Builder
	fmt.Fprintf(&b, "  clusterIP: 10.%d.%d.%d\n", 96+i>>16, (i>>8)&255, i&255)
	nodePort := ""
	if kind >= 5 && (i/10)*5+kind-5 < maxNodePorts {
		nodePort = fmt.Sprintf("\n    nodePort: %d", 30000+(i/10)*5+kind-5)
	}
	switch {
	case kind == 3:
		b.WriteString("  sessionAffinity: ClientIP\n")
	case kind >= 5 && kind <= 7 && nodePort != "":
		b.WriteString("  type: NodePort\n")
	case kind >= 8:
		b.WriteString("  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8, 192.168.0.0/16]\n")
		if nodePort == "" {
			b.WriteString("  allocateLoadBalancerNodePorts: false\n")
		}
		if kind == 9 {
			b.WriteString("  externalTrafficPolicy: Local\n")
		}
	}
	fmt.Fprintf(&b, "  ports:\n  - name: http\n    port: 80\n    targetPort: 8080%s\n", nodePort)
	if kind >= 8 {
		fmt.Fprintf(&b, "status:\n  loadBalancer:\n    ingress:\n    - ip: 203.%d.%d.%d\n", (i>>16)&255, (i>>8)&255, i&255)
	}
	return b.String()
}

// Path returns the file that holds service i in dir.
func Path(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("svc-%05d.yaml", i)) }

// Write writes service i's manifest into dir atomically, through a hidden
// temporary file and a rename, as an editor or controller would.
func Write(dir string, i, eps, version int) error {
	tmp := filepath.Join(dir, fmt.Sprintf(".svc-%05d.tmp", i))
	if err := os.WriteFile(tmp, Manifest(i, eps, version), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, Path(dir, i))
}

// WriteAll writes services 0 to n-1 with eps endpoints each.
func WriteAll(dir string, n, eps int) error {
	for i := range n {
		if err := os.WriteFile(Path(dir, i), Manifest(i, eps, 0), 0o644); err != nil {
			return err
		}
	}
	return nil
}
