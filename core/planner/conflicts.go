package planner

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

// Two service ports may claim one kernel destination: the same IP, protocol
// and port (a cluster IP, external IP or load-balancer IP: they share one
// lookup in every backend), or the same node port. The API server refuses
// such objects, but a files source, or an object restored from a backup,
// can still carry them, and both would reach the kernel as one key twice.
// Claims gives each contested destination to one claimant, as the API server
// would have: the older object wins (creation time, then namespace/name,
// then port name), and the others lose only that destination.

// claimKind says which kind of destination a claim is for.
type claimKind uint8

const (
	claimIP       claimKind = iota + 1 // address . protocol . port
	claimNodePort                      // protocol . port on every node address
)

// claim is one destination a service port claims. The index holds one per
// cluster IP, external IP, load-balancer IP and node port of every service
// port: its fields are packed (32 bytes).
type claim struct {
	addr  netip.Addr // claimIP only
	port  uint16
	proto protoCode
	kind  claimKind
}

// protoCode is a plan.Protocol in a byte.
type protoCode uint8

// The codes of the protocols a service port may use.
const (
	codeTCP protoCode = iota + 1
	codeUDP
	codeSCTP
)

// code returns p's code; the planner plans no other protocol.
func code(p plan.Protocol) protoCode {
	switch p {
	case plan.UDP:
		return codeUDP
	case plan.SCTP:
		return codeSCTP
	}
	return codeTCP
}

// protocol returns the protocol of a code.
func (c protoCode) protocol() plan.Protocol {
	switch c {
	case codeUDP:
		return plan.UDP
	case codeSCTP:
		return plan.SCTP
	}
	return plan.TCP
}

func (c claim) String() string {
	if c.kind == claimNodePort {
		return fmt.Sprintf("node port %d/%s", c.port, c.proto.protocol())
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(c.addr, c.port), c.proto.protocol())
}

// claimant is a service port claiming destinations: the claims of its
// latest Set, and the creation time of its object.
type claimant struct {
	key     plan.Key
	created time.Time
	claims  []claim
}

func (a *claimant) compare(b *claimant) int {
	if c := a.created.Compare(b.created); c != 0 {
		return c
	}
	return a.key.Compare(b.key)
}

// Claims indexes the destinations every service port claims and resolves
// conflicts between them. It is not safe for concurrent use.
type Claims struct {
	byClaim map[claim][]*claimant // sorted, the winner first
	byKey   map[plan.Key]*claimant
}

// NewClaims returns an empty index.
func NewClaims() *Claims {
	return &Claims{byClaim: map[claim][]*claimant{}, byKey: map[plan.Key]*claimant{}}
}

// claimsOf lists the destinations s claims; a health check node port
// claims its TCP node port.
func claimsOf(s *plan.Service) []claim {
	n := len(s.ClusterIPs) + len(s.ExternalIPs) + len(s.LoadBalancerIPs) + 2
	out := make([]claim, 0, n)
	add := func(c claim) {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	proto := code(s.Key.Protocol)
	for _, list := range [][]netip.Addr{s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs} {
		for _, a := range list {
			add(claim{addr: a, port: s.Port, proto: proto, kind: claimIP})
		}
	}
	if s.NodePort != 0 {
		add(claim{port: s.NodePort, proto: proto, kind: claimNodePort})
	}
	if s.HealthCheckNodePort != 0 {
		add(claim{port: s.HealthCheckNodePort, proto: codeTCP, kind: claimNodePort})
	}
	// The index keeps the list for as long as the service port exists.
	return slices.Clone(out)
}

// Set replaces what key claims with the destinations of s (nothing when s
// is nil), for an object created at created. It returns the keys whose
// resolution may have changed: every claimant of a destination key gained
// or lost, key included.
func (c *Claims) Set(key plan.Key, s *plan.Service, created time.Time) []plan.Key {
	var cur []claim
	if s != nil {
		cur = claimsOf(s)
	}
	me := c.byKey[key]
	if me == nil {
		if s == nil {
			return nil
		}
		me = &claimant{key: key}
	} else if slices.Equal(me.claims, cur) && me.created.Equal(created) {
		return nil
	}
	affected := []plan.Key{key}
	for _, cl := range me.claims {
		affected = c.others(affected, cl)
		c.remove(cl, me)
	}
	me.created, me.claims = created, cur
	for _, cl := range cur {
		affected = c.others(affected, cl)
		c.insert(cl, me)
	}
	if s == nil {
		delete(c.byKey, key)
	} else {
		c.byKey[key] = me
	}
	return affected
}

// others appends the claimants of cl to keys.
func (c *Claims) others(keys []plan.Key, cl claim) []plan.Key {
	for _, a := range c.byClaim[cl] {
		if !slices.Contains(keys, a.key) {
			keys = append(keys, a.key)
		}
	}
	return keys
}

func (c *Claims) remove(cl claim, me *claimant) {
	list := slices.DeleteFunc(c.byClaim[cl], func(a *claimant) bool { return a == me })
	if len(list) == 0 {
		delete(c.byClaim, cl)
	} else {
		c.byClaim[cl] = list
	}
}

func (c *Claims) insert(cl claim, me *claimant) {
	list := c.byClaim[cl]
	i, _ := slices.BinarySearchFunc(list, me, (*claimant).compare)
	c.byClaim[cl] = slices.Insert(list, i, me)
}

// Resolve returns s without the destinations an older claimant holds (s
// itself when it lost none) and one problem per destination lost, naming
// the winner. s must be what key last Set.
func (c *Claims) Resolve(s *plan.Service) (*plan.Service, []Problem) {
	var lost []claim
	var problems []Problem
	keepHealthCheck := false
	me := c.byKey[s.Key]
	if me == nil {
		return s, nil
	}
	for _, cl := range me.claims {
		winner := c.byClaim[cl][0]
		if winner.key == s.Key {
			continue
		}
		if sharedHealthCheck(s, winner.key, cl) {
			// Only a node port equal to the shared health check node port is
			// lost: another port of the Service holds it.
			if cl.port != s.NodePort || s.Key.Protocol != plan.TCP {
				continue
			}
			keepHealthCheck = true
		}
		lost = append(lost, cl)
		problems = append(problems, Problem{
			Object: "Service " + s.Key.Namespace + "/" + s.Key.Name,
			Field:  conflictField(s, cl),
			Reason: fmt.Sprintf("%s is already used by service port %s, created earlier; skipping it here", cl, winner.key),
		})
	}
	if len(lost) == 0 {
		return s, nil
	}
	out := without(s, lost)
	if keepHealthCheck {
		out.HealthCheckNodePort = s.HealthCheckNodePort
	}
	return out, problems
}

// sharedHealthCheck reports whether cl is the health check node port of s,
// which every port of one Service shares, held by another port of it.
func sharedHealthCheck(s *plan.Service, winner plan.Key, cl claim) bool {
	return winner.Namespace == s.Key.Namespace && winner.Name == s.Key.Name &&
		cl.kind == claimNodePort && cl.proto == codeTCP && cl.port == s.HealthCheckNodePort
}

// conflictField names the field of s that makes claim cl, for a problem.
func conflictField(s *plan.Service, cl claim) string {
	port := "port " + cmp.Or(s.Key.Port, `""`)
	switch {
	case cl.kind == claimNodePort && cl.port == s.NodePort && cl.proto == code(s.Key.Protocol):
		return "spec.ports(" + port + ").nodePort"
	case cl.kind == claimNodePort:
		return "spec.healthCheckNodePort"
	case slices.Contains(s.ClusterIPs, cl.addr):
		return "spec.clusterIPs (" + port + ")"
	case slices.Contains(s.ExternalIPs, cl.addr):
		return "spec.externalIPs (" + port + ")"
	}
	return "status.loadBalancer.ingress (" + port + ")"
}

// without returns a copy of s that no longer reaches the lost destinations.
func without(s *plan.Service, lost []claim) *plan.Service {
	out := s.Clone()
	drop := func(addrs []netip.Addr) []netip.Addr {
		return slices.DeleteFunc(addrs, func(a netip.Addr) bool {
			return slices.Contains(lost, claim{addr: a, port: s.Port, proto: code(s.Key.Protocol), kind: claimIP})
		})
	}
	out.ClusterIPs, out.ExternalIPs, out.LoadBalancerIPs = drop(out.ClusterIPs), drop(out.ExternalIPs), drop(out.LoadBalancerIPs)
	for _, cl := range lost {
		if cl.kind != claimNodePort {
			continue
		}
		if cl.port == s.NodePort && cl.proto == code(s.Key.Protocol) {
			out.NodePort = 0
		}
		if cl.port == s.HealthCheckNodePort && cl.proto == codeTCP {
			out.HealthCheckNodePort = 0
		}
	}
	return out
}
