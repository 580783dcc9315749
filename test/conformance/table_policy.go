package conformance

import "net/netip"

// podCIDR is the cluster's pod range, for rows that configure clusterCIDRs.
var podCIDR = netip.MustParsePrefix("10.244.0.0/16")

// policyRows cover traffic policies, session affinity, masquerading and
// topology hints.
func policyRows() []Row {
	return []Row{
		{
			Name: "etp-local",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
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
				// External traffic: local endpoints only, the client's address kept.
				{From: "client", To: "node:30080", Want: Pods("pod-a"), Source: "client"},
				{From: "client", To: "198.51.100.5:80", Want: Pods("pod-a"), Source: "client"},
				// The cluster IP follows internalTrafficPolicy (Cluster).
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
			},
		},
		{
			Name: "etp-local-no-local-endpoints",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				// Endpoints exist, on other nodes: dropped, not refused.
				{From: "client", To: "node:30080", Want: Dropped},
				{From: "client", To: "198.51.100.5:80", Want: Dropped},
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-b")},
			},
		},
		{
			Name: "etp-local-from-node",
			Manifests: `
# kube-proxy sends traffic that the node itself sends to an
# externalTrafficPolicy Local node port or load-balancer IP to all endpoints,
# masqueraded ("fib saddr type local" goes to the cluster chain), so that the
# node can always reach it.
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.0.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  externalTrafficPolicy: Local
  healthCheckNodePort: 32001
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.6}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-1, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "node", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "node", To: "198.51.100.5:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "node", To: "node:30081", Want: Pods("pod-b"), Source: "node"},
				{From: "node", To: "198.51.100.6:80", Want: Pods("pod-b"), Source: "node"},
			},
		},
		{
			Name:    "etp-local-from-pod",
			Options: Options{ClusterCIDRs: []netip.Prefix{podCIDR}},
			Manifests: `
# With pod traffic detected (clusterCIDRs), kube-proxy sends a pod's traffic to
# an externalTrafficPolicy Local node port or load-balancer IP to all
# endpoints, as if it had gone out to the balancer and come back.
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  externalTrafficPolicy: Local
  healthCheckNodePort: 32001
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.6}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-1, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "pod-c", To: "node:30081", Want: Pods("pod-b")},
				{From: "pod-c", To: "198.51.100.6:80", Want: Pods("pod-b")},
				// The client is no pod: still Local, and there is no local endpoint.
				{From: "client", To: "node:30081", Want: Dropped},
			},
		},
		{
			Name:    "both-policies-local-short-circuit",
			Options: Options{ClusterCIDRs: []netip.Prefix{podCIDR}},
			Manifests: `
# Both traffic policies Local: kube-proxy still computes the cluster's
# endpoints (UsesClusterEndpoints) and short-circuits to them what the node
# and its pods send to the node port and the load-balancer IP.
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 32001
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.6}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-1, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "node", To: "node:30081", Want: Pods("pod-b"), Source: "node"},
				{From: "node", To: "198.51.100.6:80", Want: Pods("pod-b"), Source: "node"},
				{From: "pod-c", To: "198.51.100.6:80", Want: Pods("pod-b")},
				// From elsewhere both policies hold: no endpoint on this node.
				{From: "client", To: "node:30081", Want: Dropped},
				{From: "pod-c", To: "10.96.0.11:80", Want: Dropped},
			},
		},
		{
			Name: "itp-local",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
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
---
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  clusterIP: 10.96.0.11
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-1, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "pod-c", To: "10.96.0.10:80", Want: Pods("pod-a"), Source: "self"},
				{From: "node", To: "10.96.0.10:80", Want: Pods("pod-a")},
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a")},
				// Endpoints exist, on other nodes: dropped, not refused.
				{From: "pod-c", To: "10.96.0.11:80", Want: Dropped},
			},
		},
		{
			Name: "affinity",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
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
				{From: "client", To: "10.96.0.10:80", Count: 20, Want: OneOf("pod-a", "pod-b", "pod-c")},
				{From: "pod-a", To: "10.96.0.10:80", Count: 20, Want: OneOf("pod-a", "pod-b", "pod-c")},
			},
		},
		{
			Name:    "cluster-cidrs",
			Options: Options{ClusterCIDRs: []netip.Prefix{podCIDR}},
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
				// From outside the pod ranges: masqueraded; from a pod: kept.
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "node", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "self"},
			},
		},
		{
			Name:    "masquerade-all",
			Options: Options{MasqueradeAll: true},
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
				{From: "pod-c", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
			},
		},
		{
			Name: "topology",
			Manifests: `
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  trafficDistribution: PreferClose
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# Hints, as the EndpointSlice controller writes them: followed because every
# ready endpoint has one and one names this node's zone.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.0.12], nodeName: node-b, zone: zone-b, hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.0.13], nodeName: node-c, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
`,
			Probes: []Probe{
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-c")},
			},
			Then: []Step{{
				Name: "the node moves to zone-b",
				Apply: `
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-b}}
`,
				Probes: []Probe{{From: "client", To: "10.96.0.10:80", Want: Pods("pod-b")}},
			}},
		},
	}
}
