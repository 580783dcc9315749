// Package health serves the HTTP health checks that probe a Weir node from
// outside.
//
// [Proxy] holds the proxy's own health and answers /healthz and /livez on
// healthzBindAddress (port 10256 by default), as kube-proxy does: /healthz
// fails while a queued change has waited too long for a sync or while this
// Node is being deleted, /livez only in the first case.
//
// [Servers] answers the per-service health-check node ports that cloud load
// balancers probe for Services with externalTrafficPolicy: Local. Each port
// answers 200 while the service has a local endpoint on this node and the
// proxy is healthy, and 503 otherwise, with the same JSON body kube-proxy
// writes so existing probes and tooling keep working.
package health
