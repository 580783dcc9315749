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

// Manifest returns service i's manifest: a Service in namespace "bench"
// (every fourth a NodePort) and its EndpointSlice with eps endpoints (at most
// 16). A non-zero version moves the first endpoint to another address, so
// writing successive versions makes one-endpoint changes.
func Manifest(i, eps, version int) []byte {
	var b strings.Builder
	typ, nodePort := "ClusterIP", ""
	if i%4 == 0 && i/4 < maxNodePorts {
		typ, nodePort = "NodePort", fmt.Sprintf("\n    nodePort: %d", 30000+i/4)
	}
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: svc-%d
  namespace: bench
spec:
  type: %s
  clusterIP: 10.%d.%d.%d
  ports:
  - name: http
    port: 80
    targetPort: 8080%s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%d-abcde
  namespace: bench
  labels:
    kubernetes.io/service-name: svc-%d
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
`, i, typ, 96+i>>16, (i>>8)&255, i&255, nodePort, i, i)
	for j := range min(eps, 16) {
		addr := fmt.Sprintf("10.%d.%d.%d", 128+i>>12, (i>>4)&255, (i&15)<<4+j)
		if j == 0 && version > 0 {
			addr = fmt.Sprintf("10.%d.%d.%d", 192+version%64, (i>>8)&255, i&255)
		}
		fmt.Fprintf(&b, "- addresses: [%q]\n  conditions: {ready: true}\n  nodeName: node-%d\n", addr, j%3)
	}
	return []byte(b.String())
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
