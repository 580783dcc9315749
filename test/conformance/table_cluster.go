package conformance

// clusterRows cover cluster IPs, node ports, endpoint states and changes,
// ports and protocols, and which services are proxied at all.
func clusterRows() []Row {
	return []Row{
		{
			Name: "clusterip",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				// Without clusterCIDRs nothing is masqueraded for where it comes from.
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
				{From: "node", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "self"},
				// Only the service's port is captured.
				{From: "client", To: "10.96.0.10:81", Want: Unanswered},
			},
		},
		{
			Name: "nodeport",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 53, nodePort: 30053}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				// externalTrafficPolicy Cluster: node-port traffic is masqueraded,
				// wherever it comes from.
				{From: "client", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "node:30053", Proto: UDP, Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "node", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
			},
		},
		{
			Name: "hairpin",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
`,
			Probes: []Probe{
				// A pod reaching itself through its service is masqueraded, or
				// its reply would bypass the reverse NAT.
				{From: "pod-a", To: "10.96.0.10:80", Want: Pods("pod-a"), Source: "node"},
				{From: "pod-b", To: "10.96.0.10:80", Want: Pods("pod-a"), Source: "self"},
			},
		},
		{
			Name: "no-endpoints",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Refused},
				{From: "node", To: "10.96.0.10:80", Want: Refused},
				{From: "pod-a", To: "10.96.0.10:80", Want: Refused},
				{From: "client", To: "10.96.0.10:53", Proto: UDP, Want: Refused},
				{From: "client", To: "node:30080", Want: Refused},
			},
			Then: []Step{{
				Name: "endpoints appear",
				Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
				Probes: []Probe{
					{From: "client", To: "10.96.0.10:80", Want: Pods("pod-b")},
					{From: "client", To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-b")},
					{From: "client", To: "node:30080", Want: Pods("pod-b")},
				},
			}},
		},
		{
			Name: "not-ready",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: false, serving: false}}
---
# Only a not-ready endpoint: the service has no endpoints at all.
apiVersion: v1
kind: Service
metadata: {name: starting, namespace: default}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: starting-1, namespace: default, labels: {kubernetes.io/service-name: starting}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.13], nodeName: node-a, conditions: {ready: false, serving: false}}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a")},
				{From: "client", To: "10.96.0.11:80", Want: Refused},
			},
		},
		{
			Name: "terminating-fallback",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# No ready endpoint: the serving terminating ones take the traffic, the
# terminating ones that no longer serve do not.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: false, serving: false, terminating: true}}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a")},
			},
			Then: []Step{{
				Name: "a ready endpoint appears",
				Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: false, serving: false, terminating: true}}
- {addresses: [10.244.0.13], nodeName: node-b}
`,
				Probes: []Probe{
					{From: "client", To: "10.96.0.10:80", Want: Pods("pod-c")},
				},
			}},
		},
		{
			Name: "udp",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-a", "pod-b"), Source: "client"},
				{From: "node", To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-a", "pod-b"), Source: "self"},
				// The port is UDP only.
				{From: "client", To: "10.96.0.10:53", Want: Unanswered},
			},
		},
		{
			Name: "udp-stale-flows",
			// No objects yet: the client's datagrams to the future VIP are
			// routed away, and conntrack remembers the flow without any NAT.
			Probes: []Probe{
				{From: "client", FromPort: 40053, To: "10.96.0.10:53", Proto: UDP, Want: Unanswered},
			},
			Then: []Step{
				{
					// The same flow must now reach the endpoint: the proxy clears the
					// entry that predates the service.
					Name: "the service appears",
					Apply: `
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
					Probes: []Probe{
						{From: "client", FromPort: 40053, To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-b")},
					},
				},
				{
					// pod-b still runs, but is no endpoint any more: the flow moves.
					Name: "pod-a replaces pod-b",
					Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
`,
					Probes: []Probe{
						{From: "client", FromPort: 40053, To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-a")},
					},
				},
			},
		},
		{
			Name: "named-ports",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: dns, port: 53, protocol: UDP, targetPort: dns}
  - {name: metrics, port: 9090, targetPort: metrics}
---
# Service ports find their endpoints' ports by name and protocol; no pod
# exposes "metrics", so that port has no endpoints.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b")},
				{From: "client", To: "10.96.0.10:53", Proto: UDP, Want: Pods("pod-a", "pod-b")},
				{From: "client", To: "10.96.0.10:9090", Want: Refused},
				{From: "client", To: "10.96.0.10:53", Want: Unanswered},
			},
		},
		{
			Name: "duplicate-endpoints",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# pod-b is listed by both slices (as during a slice controller's move): it
# counts once.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
- {addresses: [10.244.0.13], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b", "pod-c")},
			},
		},
		{
			Name: "endpoint-in-two-slices",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# pod-a's address is terminating in the first slice (an old pod whose IP was
# reused) and ready in the second: like kube-proxy, the copy that is not
# terminating wins, whichever slice comes first.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: false, terminating: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a")},
			},
		},
		{
			Name: "endpoint-changes",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
- {addresses: [10.244.0.13], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b", "pod-c")},
			},
			Then: []Step{
				{
					Name: "scale down: pod-b leaves",
					Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.13], nodeName: node-b}
`,
					Probes: []Probe{{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-c")}},
				},
				{
					Name: "pod-b replaces pod-c",
					Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
`,
					Probes: []Probe{{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b")}},
				},
				{
					Name:   "the service is deleted",
					Delete: []string{"Service default/web", "EndpointSlice default/web-1"},
					Probes: []Probe{{From: "client", To: "10.96.0.10:80", Want: Unanswered}},
				},
			},
		},
		{
			Name: "service-proxy-name",
			Manifests: `
# As kube-proxy's informers see them: a Service for another proxy is left
# alone; a Service labelled headless is proxied (only the EndpointSlice
# controller's slices of headless services carry that label); a slice
# labelled headless is left out.
apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: default
  labels: {service.kubernetes.io/service-proxy-name: other-proxy}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: default, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata:
  name: labelled-headless
  namespace: default
  labels: {service.kubernetes.io/headless: ""}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: labelled-headless-1, namespace: default, labels: {kubernetes.io/service-name: labelled-headless}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.12
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-2
  namespace: default
  labels: {kubernetes.io/service-name: web, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.13], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.12:80", Want: Pods("pod-a")},
				{From: "client", To: "10.96.0.10:80", Want: Unanswered},
				{From: "client", To: "10.96.0.11:80", Want: Pods("pod-b")},
			},
			Then: []Step{{
				Name: "the proxy-name label is removed",
				Apply: `
apiVersion: v1
kind: Service
metadata: {name: other, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
`,
				Probes: []Probe{{From: "client", To: "10.96.0.10:80", Want: Pods("pod-b")}},
			}, {
				Name: "the headless label leaves web-2",
				Apply: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.13], nodeName: node-b}
`,
				Probes: []Probe{{From: "client", To: "10.96.0.12:80", Want: Pods("pod-a", "pod-c")}},
			}},
		},
	}
}
