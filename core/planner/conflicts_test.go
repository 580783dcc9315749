package planner

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

func svcPort(name, ip string, port, nodePort uint16) *plan.Service {
	return &plan.Service{Key: plan.Key{Namespace: "default", Name: name, Port: "http", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: port, NodePort: nodePort}
}

var (
	t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Hour)
)

func TestClaimsOlderObjectWins(t *testing.T) {
	c := NewClaims()
	older := svcPort("zeta", "10.96.0.1", 80, 30080)
	newer := svcPort("alpha", "10.96.0.2", 80, 30080) // the same node port, a name that sorts first
	if got := c.Set(older.Key, older, t0); !slices.Equal(got, []plan.Key{older.Key}) {
		t.Errorf("first Set affected %v", got)
	}
	affected := c.Set(newer.Key, newer, t1)
	if !slices.Contains(affected, older.Key) || !slices.Contains(affected, newer.Key) {
		t.Errorf("second Set affected %v, want both keys", affected)
	}
	if got, problems := c.Resolve(older); got != older || problems != nil {
		t.Errorf("older lost something: %v %v", got, problems)
	}
	got, problems := c.Resolve(newer)
	if got.NodePort != 0 || !slices.Equal(got.ClusterIPs, newer.ClusterIPs) || newer.NodePort != 30080 {
		t.Errorf("newer resolved to %v (input %v): want the node port dropped, the cluster IP kept, the input untouched", got, newer)
	}
	if len(problems) != 1 || problems[0].Field != "spec.ports(port http).nodePort" ||
		!strings.Contains(problems[0].Reason, "node port 30080/TCP is already used by service port default/zeta:http/TCP") {
		t.Errorf("problems = %v", problems)
	}
	// The winner leaves: the other gets the node port back.
	affected = c.Set(older.Key, nil, t0)
	if !slices.Contains(affected, newer.Key) {
		t.Errorf("removing the winner affected %v, want the loser", affected)
	}
	if got, problems := c.Resolve(newer); got != newer || problems != nil {
		t.Errorf("after the winner left: %v %v", got, problems)
	}
}

func TestClaimsSameAgeByName(t *testing.T) {
	c := NewClaims()
	a := svcPort("a", "10.96.0.1", 80, 0)
	b := svcPort("b", "10.96.0.1", 80, 0)
	b.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	c.Set(b.Key, b, time.Time{})
	c.Set(a.Key, a, time.Time{})
	got, problems := c.Resolve(b)
	if len(got.ClusterIPs) != 0 || len(got.ExternalIPs) != 1 || len(problems) != 1 ||
		problems[0].Field != "spec.clusterIPs (port http)" {
		t.Errorf("b resolved to %v, %v: want only its cluster IP lost", got, problems)
	}
	// A different port on the same IP is no conflict.
	other := svcPort("c", "10.96.0.1", 81, 0)
	c.Set(other.Key, other, time.Time{})
	if _, problems := c.Resolve(other); problems != nil {
		t.Errorf("port 81 conflicts: %v", problems)
	}
	// An unchanged Set affects nothing.
	if got := c.Set(a.Key, a, time.Time{}); got != nil {
		t.Errorf("unchanged Set affected %v", got)
	}
}

func TestClaimsHealthCheckNodePort(t *testing.T) {
	c := NewClaims()
	lb := svcPort("lb", "10.96.0.1", 80, 30080)
	lb.HealthCheckNodePort = 31000
	np := svcPort("np", "10.96.0.2", 80, 31000)
	c.Set(lb.Key, lb, t0)
	c.Set(np.Key, np, t1)
	if got, _ := c.Resolve(np); got.NodePort != 0 {
		t.Errorf("a TCP node port equal to an older health check node port was kept: %v", got)
	}
	// Every port of one Service shares its health check node port.
	https := svcPort("lb", "10.96.0.1", 443, 30443)
	https.Key.Port, https.HealthCheckNodePort = "https", 31000
	c.Set(https.Key, https, t0)
	if got, problems := c.Resolve(https); got != https {
		t.Errorf("a second port of the service lost its shared health check port: %v", problems)
	}
	c.Set(np.Key, np, t0.Add(-time.Hour))
	got, problems := c.Resolve(lb)
	if got.HealthCheckNodePort != 0 || got.NodePort != 30080 || len(problems) != 1 || problems[0].Field != "spec.healthCheckNodePort" {
		t.Errorf("lb resolved to %v, %v", got, problems)
	}
}
