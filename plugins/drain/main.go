// Command drain is a Weir hook plugin that takes the endpoints on chosen
// nodes (by name or shell pattern) out of every service, by dropping them
// or setting their weight to 0, without ever leaving a service with no
// serving endpoint unless told to. See README.md.
package main

import (
	"errors"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

// The modes: drop the endpoints, or keep them with weight 0.
const (
	modeDrop    = "drop"
	modeWeight0 = "weight0"
)

// config is the plugin's configuration as Weir hands it over.
type config struct {
	// Nodes are node names to drain.
	Nodes []string `json:"nodes"`
	// Patterns are path.Match patterns of node names to drain.
	Patterns []string `json:"patterns"`
	// KeepLast leaves an address family of a service alone when draining
	// would take all its serving endpoints.
	KeepLast bool `json:"keepLast"`
	// Mode is drop or weight0.
	Mode string `json:"mode"`
}

// settings is the configuration in force.
type settings struct {
	// nodes holds the configured node names (true) and caches the patterns'
	// verdict on the other names seen, up to maxNodes entries.
	nodes    map[string]bool
	patterns []string
	keepLast bool
	weight0  bool
}

var (
	current = settings{keepLast: true}
	// logOut receives one line per service that keepLast spares.
	logOut io.Writer = os.Stderr
	// plugin is what init registers; tests run it through sdktest.
	plugin = guest.Plugin{Configure: configure, Process: process}
)

func init() { guest.Register(plugin) }

func main() {}

// configure parses and checks the configuration; with none nothing is drained.
func configure(raw []byte) error {
	c := config{KeepLast: true, Mode: modeDrop}
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if c.Mode != modeDrop && c.Mode != modeWeight0 {
		return errors.New("mode: " + strconv.Quote(c.Mode) + " is not " + modeDrop + " or " + modeWeight0)
	}
	s := settings{nodes: make(map[string]bool, len(c.Nodes)), keepLast: c.KeepLast, weight0: c.Mode == modeWeight0}
	for i, n := range c.Nodes {
		if n == "" {
			return errors.New("nodes[" + strconv.Itoa(i) + "]: empty node name")
		}
		s.nodes[n] = true
	}
	for i, p := range c.Patterns {
		if _, err := path.Match(p, ""); p == "" || err != nil {
			return errors.New("patterns[" + strconv.Itoa(i) + "]: " + strconv.Quote(p) + " is not a valid shell pattern")
		}
		s.patterns = append(s.patterns, p)
	}
	current = s
	return nil
}

// process drains the configured nodes' endpoints from every service.
func process(b *abi.Batch) error {
	if len(current.nodes) == 0 && len(current.patterns) == 0 {
		return nil
	}
	for i := range b.Len() {
		drain(b.Service(i), &current)
	}
	return nil
}

// maxNodes bounds the node names settings.nodes remembers.
const maxNodes = 1 << 16

// drained reports whether an endpoint's node is to be drained; endpoints
// without a node name never are.
func (c *settings) drained(e abi.Endpoint) bool {
	n := e.NodeName()
	if n == "" {
		return false
	}
	if d, ok := c.nodes[n]; ok || len(c.patterns) == 0 {
		return d
	}
	d := false
	for _, p := range c.patterns {
		if ok, _ := path.Match(p, n); ok {
			d = true
			break
		}
	}
	if len(c.nodes) < maxNodes {
		c.nodes[strings.Clone(n)] = d
	}
	return d
}

// marks holds, by endpoint id, whether drain decided to take the endpoint;
// reused from service to service.
var marks []bool

// drain takes the drained endpoints out of one service, address family by
// address family; with keepLast, a family that would lose all its serving
// endpoints is left as it is.
func drain(s abi.Service, c *settings) {
	n := s.Len()
	if cap(marks) < n {
		marks = make([]bool, n)
	}
	marks = marks[:n]
	var found, had, left, spare [2]bool
	for i := range n {
		e := s.Endpoint(i)
		f, d := family(e), c.drained(e)
		marks[i] = d
		found[f] = found[f] || d
		if serving(e) {
			had[f] = true
			left[f] = left[f] || !d
		}
	}
	for f := range spare {
		if spare[f] = found[f] && c.keepLast && had[f] && !left[f]; spare[f] {
			_, _ = io.WriteString(logOut, s.Key().String()+": every serving "+familyName[f]+
				" endpoint is on a drained node; left unchanged (keepLast)\n")
		}
	}
	if found == spare {
		return
	}
	// Weir numbers a service's endpoints 0..n-1 in the order it sends them,
	// so an endpoint's id is its slot in marks, whatever the slot order now.
	take := func(e abi.Endpoint) bool {
		id := int(e.ID())
		return id < n && marks[id] && !spare[family(e)]
	}
	if c.weight0 {
		for i := range n {
			if e := s.Endpoint(i); take(e) {
				e.SetWeight(0)
			}
		}
		return
	}
	s.Keep(func(e abi.Endpoint) bool { return !take(e) })
}

// serving reports whether an endpoint gets traffic under either policy.
func serving(e abi.Endpoint) bool {
	return e.Weight() > 0 && (e.ForCluster() || e.ForLocal())
}

// familyName names the address families for the log.
var familyName = [2]string{"IPv4", "IPv6"}

// family is 0 for an IPv4 endpoint, 1 for IPv6.
func family(e abi.Endpoint) int {
	if e.Address().Is4() {
		return 0
	}
	return 1
}
