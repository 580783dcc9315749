package conformance

// dualStackRows cover IPv6 and dual-stack services: every pod also has an
// IPv6 address (fd00:10:244::11 to ::13), the client and the node have
// fd00:172:30::2 and ::1, and IPv6 VIPs come from fd00:10:96::/112.
func dualStackRows() []Row {
	return []Row{
		{
			Name: "dual-stack",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:10:96::10"]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00:10:244::11"], nodeName: node-a}
- {addresses: ["fd00:10:244::13"], nodeName: node-b}
`,
			Probes: []Probe{
				// Each family balances over its own slice.
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
				{From: "client", To: "[fd00:10:96::10]:80", Want: Pods("pod-a", "pod-c"), Source: "client"},
				{From: "node", To: "[fd00:10:96::10]:80", Want: Pods("pod-a", "pod-c")},
				{From: "pod-b", To: "[fd00:10:96::10]:80", Want: Pods("pod-a", "pod-c"), Source: "self"},
				// NodePorts answer on the node's IPv6 address, masqueraded.
				{From: "client", To: "node6:30080", Want: Pods("pod-a", "pod-c"), Source: "node"},
				{From: "client", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
			},
			Then: []Step{{
				Name: "the IPv6 slice loses pod-c",
				Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00:10:244::11"], nodeName: node-a}
`,
				Probes: []Probe{
					{From: "client", To: "[fd00:10:96::10]:80", Want: Pods("pod-a")},
					{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b")},
				},
			}},
		},
		{
			Name: "ipv6-only",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::20"
  clusterIPs: ["fd00:10:96::20"]
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: ["fd00:10:244::12"], nodeName: node-a}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::21"
  clusterIPs: ["fd00:10:96::21"]
  ports: [{name: http, port: 80}]
`,
			Probes: []Probe{
				{From: "client", To: "[fd00:10:96::20]:80", Want: Pods("pod-b"), Source: "client"},
				{From: "client", To: "[fd00:10:96::20]:53", Proto: UDP, Want: Pods("pod-b")},
				// Hairpin over IPv6.
				{From: "pod-b", To: "[fd00:10:96::20]:80", Want: Pods("pod-b"), Source: "node"},
				{From: "client", To: "[fd00:10:96::21]:80", Want: Refused},
				{From: "pod-a", To: "[fd00:10:96::21]:80", Want: Refused},
			},
		},
	}
}
