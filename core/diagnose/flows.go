package diagnose

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirproxy/weir/core/conntrack"
	"github.com/weirproxy/weir/sdk/plan"
)

// flowFindings reports the conntrack entries of one service port: how
// many reach each serving endpoint (for TCP, how many of those are open
// connections, closing ones left out), and those whose replies come from an
// address that no longer serves. For UDP and SCTP such entries keep
// sending a client's packets to the gone endpoint until they time out:
// traffic is lost, and weir run deletes them at its next sync.
func flowFindings(subject string, proto plan.Protocol, counts []conntrack.FlowCount) []Finding {
	if counts == nil {
		return nil
	}
	byEndpoint, active := map[netip.Addr]int{}, map[netip.Addr]int{}
	stale, total := 0, 0
	var staleFrom []netip.Addr
	for _, c := range counts {
		for a, n := range c.ByEndpoint {
			byEndpoint[a] += n
		}
		for a, n := range c.Active {
			active[a] += n
		}
		stale += c.Stale
		total += c.Total()
		for _, a := range c.StaleFrom {
			if !slices.Contains(staleFrom, a) {
				staleFrom = append(staleFrom, a)
			}
		}
	}
	f := func(code string, sev Severity, format string, args ...any) Finding {
		return Finding{Code: code, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...)}
	}
	var parts []string
	for _, a := range slices.SortedFunc(maps.Keys(byEndpoint), netip.Addr.Compare) {
		part := fmt.Sprintf("%s %d", a, byEndpoint[a])
		if proto == plan.TCP {
			// Every UDP and SCTP entry is active; TCP ones may be closing.
			part += fmt.Sprintf(" (%d active)", active[a])
		}
		parts = append(parts, part)
	}
	out := []Finding{f("conntrack.flows", Info, "%d tracked %s to its addresses%s", total, plural(total, "flow", "flows"), listSuffix(parts))}
	if stale == 0 {
		return out
	}
	from := prefixes(staleFrom)
	if proto == plan.TCP {
		return append(out, f("conntrack.old-connections", Info,
			"%d %s still %s to %s, which no longer serves: they end with it", stale, plural(stale, "connection", "connections"),
			plural(stale, "goes", "go"), from))
	}
	return append(out, f("conntrack.stale", Broken,
		"%d %s %s still %s to %s, which no longer serves: clients that keep their port are black-holed until the entries time out; "+
			"weir run deletes them at its next sync (conntrack -D -p %s --reply-src ADDR by hand)",
		stale, proto, plural(stale, "flow", "flows"), plural(stale, "goes", "go"), from, strings.ToLower(string(proto))))
}

func listSuffix(parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}
