// Command zone-preference is a Weir hook plugin that keeps a service's
// traffic in this node's zone when the zone has enough endpoints: it drops
// the endpoints of other zones, or (mode weight) multiplies the weights of
// the zone's own. See README.md.
package main

import (
	"errors"
	"io"
	"math"
	"os"
	"strconv"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

// disabledAnnotation opts a service out when "true".
const disabledAnnotation = "zone-preference.weir.dev/disabled"

// The modes: drop other zones' endpoints, or weight the zone's own up.
const (
	modeDrop   = "drop"
	modeWeight = "weight"
)

// config is the plugin's configuration as Weir hands it over.
type config struct {
	// MinEndpoints is how many serving in-zone endpoints a service needs
	// before the preference applies.
	MinEndpoints uint32 `json:"minEndpoints"`
	// Mode is drop or weight.
	Mode string `json:"mode"`
	// Weight multiplies the in-zone endpoints' weights in weight mode.
	Weight *uint32 `json:"weight"`
}

// settings is the configuration in force.
type settings struct {
	minEndpoints uint32
	weight       uint32 // 0 in drop mode
}

var (
	current = settings{minEndpoints: 2}
	// logOut receives one line per service whose annotation is rejected.
	logOut io.Writer = os.Stderr
	// plugin is what init registers; tests run it through sdktest.
	plugin = guest.Plugin{Configure: configure, Process: process}
)

func init() { guest.Register(plugin) }

func main() {}

// configure parses and checks the configuration; with none the defaults apply.
func configure(raw []byte) error {
	c := config{MinEndpoints: 2, Mode: modeDrop}
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	s := settings{minEndpoints: c.MinEndpoints}
	if c.MinEndpoints == 0 {
		return errors.New("minEndpoints: must be at least 1")
	}
	switch c.Mode {
	case modeDrop:
		if c.Weight != nil {
			return errors.New("weight: only used with mode " + modeWeight)
		}
	case modeWeight:
		s.weight = 10
		if c.Weight != nil {
			s.weight = *c.Weight
		}
		if s.weight < 2 {
			return errors.New("weight: must be at least 2, got " + strconv.FormatUint(uint64(s.weight), 10))
		}
	default:
		return errors.New("mode: " + strconv.Quote(c.Mode) + " is not " + modeDrop + " or " + modeWeight)
	}
	current = s
	return nil
}

// process applies the preference to every service that has not opted out;
// on a node without a zone it changes nothing.
func process(b *abi.Batch) error {
	zone := b.NodeZone()
	if zone == "" {
		return nil
	}
	for i := range b.Len() {
		if s := b.Service(i); enabled(s) {
			prefer(s, zone, current)
		}
	}
	return nil
}

// enabled reads the opt-out annotation; a value that is not a boolean
// leaves the service alone and is logged.
func enabled(s abi.Service) bool {
	v, ok := s.Annotation(disabledAnnotation)
	if !ok {
		return true
	}
	off, err := strconv.ParseBool(v)
	if err != nil {
		_, _ = io.WriteString(logOut, s.Key().String()+": annotation "+disabledAnnotation+"="+quote(v)+
			" is not true or false; service left unchanged\n")
		return false
	}
	return !off
}

// prefer applies the preference to one service, separately for its IPv4 and
// IPv6 endpoints: a family with at least minEndpoints serving endpoints for
// cluster traffic in the zone loses (or is weighted away from) the others.
func prefer(s abi.Service, zone string, cfg settings) {
	var n [2]uint32
	for i := range s.Len() {
		e := s.Endpoint(i)
		if e.Serving() && e.ForCluster() && e.Weight() > 0 && e.Zone() == zone {
			n[family(e)]++
		}
	}
	on := [2]bool{n[0] >= cfg.minEndpoints, n[1] >= cfg.minEndpoints}
	if !on[0] && !on[1] {
		return
	}
	// Endpoints on this node are in its zone even when their zone is unset.
	inZone := func(e abi.Endpoint) bool { return e.Local() || e.Zone() == zone }
	if cfg.weight == 0 {
		s.Keep(func(e abi.Endpoint) bool { return !on[family(e)] || inZone(e) })
		return
	}
	for i := range s.Len() {
		if e := s.Endpoint(i); on[family(e)] && inZone(e) {
			e.SetWeight(uint32(min(uint64(e.Weight())*uint64(cfg.weight), math.MaxUint32)))
		}
	}
}

// family is 0 for an IPv4 endpoint, 1 for IPv6.
func family(e abi.Endpoint) int {
	if e.Address().Is4() {
		return 0
	}
	return 1
}

// quote quotes an annotation value for the log, cut to 64 bytes.
func quote(v string) string {
	if len(v) > 64 {
		return strconv.Quote(v[:64]) + "..."
	}
	return strconv.Quote(v)
}
