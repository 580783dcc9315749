package conformance

// externalRows cover external IPs, load-balancer ingress IPs (and their
// ipMode) and loadBalancerSourceRanges.
func externalRows() []Row {
	return []Row{
		{
			Name: "external-ips",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [192.0.2.10]
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
				// externalTrafficPolicy Cluster: masqueraded, from anywhere.
				{From: "client", To: "192.0.2.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "192.0.2.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "node", To: "192.0.2.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "192.0.2.10:81", Want: Unanswered},
			},
		},
		{
			Name: "external-ips-etp-local",
			Manifests: `
# kube-proxy honours externalTrafficPolicy Local on a ClusterIP service with
# external IPs, which makes it externally accessible (ExternalPolicyLocal).
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: ClusterIP # the API server's default, which the table does not apply
  clusterIP: 10.96.0.10
  externalIPs: [192.0.2.10]
  externalTrafficPolicy: Local
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
				// External traffic: this node's endpoint only, the client's address kept.
				{From: "client", To: "192.0.2.10:80", Want: Pods("pod-a"), Source: "client"},
				// The node itself reaches every endpoint, masqueraded.
				{From: "node", To: "192.0.2.10:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				// The cluster IP follows internalTrafficPolicy (Cluster).
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
			},
		},
		{
			Name: "loadbalancer",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
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
				{From: "client", To: "198.51.100.5:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "pod-c", To: "198.51.100.5:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "node:30080", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "10.96.0.10:80", Want: Pods("pod-a", "pod-b"), Source: "client"},
			},
		},
		{
			Name: "loadbalancer-ipmode-proxy",
			Manifests: `
# With ipMode Proxy the balancer delivers traffic to the node itself, so the
# ingress IP must not be captured; ipMode VIP (the default) is.
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5, ipMode: VIP}, {ip: 198.51.100.6, ipMode: Proxy}]
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
				{From: "client", To: "198.51.100.5:80", Want: Pods("pod-a", "pod-b"), Source: "node"},
				{From: "client", To: "198.51.100.6:80", Want: Unanswered},
				{From: "pod-c", To: "198.51.100.6:80", Want: Unanswered},
			},
		},
		{
			Name: "source-ranges",
			Manifests: `
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [10.244.0.0/24]
  ports: [{name: https, port: 443, targetPort: 8080, nodePort: 30443}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: shop-1, namespace: default, labels: {kubernetes.io/service-name: shop}}
addressType: IPv4
ports: [{name: https, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
			Probes: []Probe{
				{From: "client", To: "198.51.100.5:443", Want: Dropped},
				{From: "pod-a", To: "198.51.100.5:443", Want: Pods("pod-b"), Source: "node"},
				// The ranges limit the load-balancer IPs only.
				{From: "client", To: "10.96.0.10:443", Want: Pods("pod-b")},
				{From: "client", To: "node:30443", Want: Pods("pod-b")},
			},
			Then: []Step{{
				Name: "the client's range is allowed",
				Apply: `
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [10.244.0.0/24, 172.30.0.0/24]
  ports: [{name: https, port: 443, targetPort: 8080, nodePort: 30443}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
`,
				Probes: []Probe{{From: "client", To: "198.51.100.5:443", Want: Pods("pod-b"), Source: "node"}},
			}},
		},
	}
}
