package conformance

import "fmt"

// checkRows cover the checks that refuse or drop a new connection instead
// of forwarding it, where a differential run against kube-proxy found
// Weir's order or placement of them wrong: source ranges against the
// node's own connections, the refusal of node ports without endpoints on
// the input path only, and which of the two comes first.
func checkRows() []Row {
	return []Row{sourceRangesFromNodeRow(), noEndpointsNodePortFromNodeRow(), sourceRangesNoEndpointsRow()}
}

// sourceRangesFromNodeRow: loadBalancerSourceRanges apply to the node's
// own connections too; a range holding the node's IP lets them in. (In
// mode ipvs they leave from the load-balancer IP, on Weir's interface:
// only the load-balancer IP allowed as a source, as kube-proxy's
// allowFromNode does, lets them in there.)
func sourceRangesFromNodeRow() Row {
	const shop = `
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [%s]
  ports: [{name: https, port: 443, targetPort: 8080, nodePort: 30443}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
`
	return Row{
		Name: "source-ranges-node",
		Manifests: `
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 172.30.0.1}, {type: InternalIP, address: "fd00:172:30::1"}]
---` + fmt.Sprintf(shop, "10.244.0.0/24") + `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: shop-1, namespace: default, labels: {kubernetes.io/service-name: shop}}
addressType: IPv4
ports: [{name: https, port: 8080}]
endpoints:
- {addresses: [10.244.0.12], nodeName: node-b}
`,
		Probes: []Probe{
			{From: "node", To: "198.51.100.5:443", Want: Dropped},
			{From: "pod-a", To: "198.51.100.5:443", Want: Pods("pod-b"), Source: "node"},
		},
		Then: []Step{{
			Name:  "the node's range is allowed",
			Apply: fmt.Sprintf(shop, "10.244.0.0/24, 172.30.0.0/24"),
			Probes: []Probe{
				{From: "node", To: "198.51.100.5:443", Want: Pods("pod-b"), Source: "node"},
				{From: "pod-a", To: "198.51.100.5:443", Want: Pods("pod-b"), Source: "node"},
			},
		}},
	}
}

// noEndpointsNodePortFromNodeRow: the node's own connections to its node
// port of a service without endpoints are refused on the input path,
// after they left: a UDP sender gets the ICMP error, not a failed send.
// Not in mode ipvs: IPVS takes the node's datagram on its output path and,
// with no real server, sends the ICMP error and drops it there
// (ip_vs_leave), so the send fails first, as with kube-proxy's IPVS mode.
func noEndpointsNodePortFromNodeRow() Row {
	return Row{
		Name: "no-endpoints-nodeport-node",
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
`,
		Probes: []Probe{
			{From: "node", To: "node:30053", Proto: UDP, Want: Refused, ByMode: []ModeWant{{Mode: IPVS, Want: RefusedAtSend,
				Why: "IPVS refuses the node's own datagram on its output path, where it has no real server"}}},
			{From: "node", To: "node:30080", Want: Refused},
			{From: "client", To: "node:30053", Proto: UDP, Want: Refused},
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
				{From: "node", To: "node:30053", Proto: UDP, Want: Pods("pod-b")},
				{From: "node", To: "node:30080", Want: Pods("pod-b")},
			},
		}},
	}
}

// sourceRangesNoEndpointsRow: a load balancer with source ranges and no
// endpoints at all. kube-proxy's iptables mode writes no firewall for it
// and refuses every source; its nftables mode checks the ranges first and
// drops the sources outside them (so does IPVS, whose filter table drops
// them before IPVS refuses).
func sourceRangesNoEndpointsRow() Row {
	dropped := []ModeWant{
		{Mode: NFTables, Want: Dropped, Why: "the source ranges are checked before DNAT, before the endpoints"},
		{Mode: IPVS, Want: Dropped, Why: "the filter table checks the ranges before IPVS refuses"},
	}
	return Row{
		Name: "source-ranges-no-endpoints",
		Manifests: `
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [198.51.100.10/32]
  ports: [{name: https, port: 443, targetPort: 8080, nodePort: 30443}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.5}]
`,
		Probes: []Probe{
			{From: "client", To: "198.51.100.5:443", Want: Refused, ByMode: dropped},
			{From: "pod-a", To: "198.51.100.5:443", Want: Refused, ByMode: dropped},
		},
		Then: []Step{{
			Name: "endpoints appear",
			Apply: `
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
				{From: "pod-a", To: "198.51.100.5:443", Want: Dropped},
				{From: "client", To: "10.96.0.10:443", Want: Pods("pod-b")},
			},
		}},
	}
}
