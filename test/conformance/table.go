package conformance

// The table. Every row uses the same small cluster: pods pod-a 10.244.0.11,
// pod-b 10.244.0.12 and pod-c 10.244.0.13 serving 8080 and 53; the client at
// 172.30.0.2 outside the node; the node at 172.30.0.1 on the client link
// (its NodePort address, and the masquerade source). Service VIPs are taken
// from 10.96.0.0/12, external IPs from 192.0.2.0/24 and load-balancer IPs
// from 198.51.100.0/24. Endpoints on node-a are local, on node-b remote.
//
// Rows are grouped by concern: cluster IPs and endpoints (table_cluster.go),
// external addresses (table_external.go), traffic policies, masquerading and
// topology (table_policy.go), dual-stack (table_dualstack.go), and the
// checks that refuse or drop instead of forwarding (table_checks.go).

// Rows returns the conformance table, in a stable order; each call returns
// fresh rows that the caller may change.
func Rows() []Row {
	var rows []Row
	rows = append(rows, clusterRows()...)
	rows = append(rows, externalRows()...)
	rows = append(rows, policyRows()...)
	rows = append(rows, dualStackRows()...)
	rows = append(rows, checkRows()...)
	return rows
}
