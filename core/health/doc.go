// Package health serves the HTTP health checks that probe a Weir node from
// outside.
//
// [Servers] answers the per-service health-check node ports that cloud load
// balancers probe for Services with externalTrafficPolicy: Local. Each port
// answers 200 while the service has a local endpoint on this node and the
// proxy is healthy, and 503 otherwise, with the same JSON body kube-proxy
// writes so existing probes and tooling keep working.
package health
