package ipvs

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

func vs(sched string, persistence uint32, reals ...any) *virtualServer {
	v := newVirtualServer(sched, persistence)
	for i := 0; i < len(reals); i += 2 {
		v.reals[netip.MustParseAddrPort(reals[i].(string))] = int32(reals[i+1].(int))
	}
	return v
}

func draining(v *virtualServer, addrs ...string) *virtualServer {
	for _, a := range addrs {
		v.draining[netip.MustParseAddrPort(a)] = time.Unix(1, 0)
	}
	return v
}

func opsText(ops []op) string {
	var lines []string
	for _, o := range ops {
		lines = append(lines, o.String())
	}
	return strings.Join(lines, "\n")
}

func TestDiff(t *testing.T) {
	tcp := vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.TCP, port: 80}
	udp := vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: plan.UDP, port: 53}
	const a, b, c = "10.244.0.11:8080", "10.244.0.12:8080", "10.244.0.13:8080"
	tests := []struct {
		name      string
		key       vsKey
		old, want *virtualServer
		ops       string
	}{
		{"nothing", tcp, nil, nil, ""},
		{"new", tcp, nil, vs("rr", 0, b, 1, a, 2),
			"add-vs TCP 10.96.0.10:80 rr\nadd-rs TCP 10.96.0.10:80 10.244.0.11:8080 w2\nadd-rs TCP 10.96.0.10:80 10.244.0.12:8080 w1"},
		{"gone", tcp, vs("rr", 0, a, 1), nil, "del-vs TCP 10.96.0.10:80"},
		{"same", tcp, vs("rr", 0, a, 1), vs("rr", 0, a, 1), ""},
		{"scheduler and persistence", tcp, vs("rr", 0, a, 1), vs("sh", 30, a, 1), "update-vs TCP 10.96.0.10:80 sh persistent 30s"},
		{"weight", tcp, vs("wrr", 0, a, 1, b, 1), vs("wrr", 0, a, 1, b, 3), "update-rs TCP 10.96.0.10:80 10.244.0.12:8080 w3"},
		{"removed TCP real server drains", tcp, vs("rr", 0, a, 1, b, 1), vs("rr", 0, a, 1),
			"drain-rs TCP 10.96.0.10:80 10.244.0.12:8080"},
		{"draining stays draining", tcp, draining(vs("rr", 0, a, 1, b, 0), b), vs("rr", 0, a, 1), ""},
		{"draining one is restored", tcp, draining(vs("rr", 0, a, 1, b, 0), b), vs("rr", 0, a, 1, b, 1),
			"update-rs TCP 10.96.0.10:80 10.244.0.12:8080 w1"},
		{"removed UDP real server goes at once", udp, vs("rr", 0, "10.244.0.11:53", 1, "10.244.0.12:53", 1), vs("rr", 0, "10.244.0.11:53", 1),
			"del-rs UDP 10.96.0.10:53 10.244.0.12:53"},
		{"swap", tcp, vs("rr", 0, a, 1, b, 1), vs("rr", 0, a, 1, c, 1),
			"add-rs TCP 10.96.0.10:80 10.244.0.13:8080 w1\ndrain-rs TCP 10.96.0.10:80 10.244.0.12:8080"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := opsText(diff(tt.key, tt.old, tt.want)); got != tt.ops {
				t.Errorf("got\n%s\nwant\n%s", got, tt.ops)
			}
		})
	}
}

func TestReapable(t *testing.T) {
	since := time.Unix(1000, 0)
	grace := time.Minute
	for _, tt := range []struct {
		c    connCounts
		now  time.Time
		want bool
	}{
		{connCounts{}, since, true},
		{connCounts{active: 1}, since.Add(time.Second), false},
		{connCounts{inactive: 2}, since.Add(59 * time.Second), false},
		{connCounts{active: 1}, since.Add(time.Minute), true},
	} {
		if got := reapable(tt.c, since, tt.now, grace); got != tt.want {
			t.Errorf("reapable(%+v, after %s) = %v, want %v", tt.c, tt.now.Sub(since), got, tt.want)
		}
	}
}
