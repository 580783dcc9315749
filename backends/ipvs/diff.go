package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// opKind is one kind of IPVS change.
type opKind uint8

const (
	opAddVS opKind = iota
	opUpdateVS
	opDelVS
	opAddRS
	opUpdateRS
	// opDrainRS sets a removed real server's weight to 0 and starts its
	// graceful termination.
	opDrainRS
	opDelRS
)

var opNames = [...]string{"add-vs", "update-vs", "del-vs", "add-rs", "update-rs", "drain-rs", "del-rs"}

// op is one netlink change to a virtual server or one of its real servers.
type op struct {
	kind opKind
	key  vsKey
	// vs carries the settings for opAddVS and opUpdateVS.
	vs *virtualServer
	// real and weight are the real server of the *RS kinds.
	real   netip.AddrPort
	weight int32
}

// String formats the op for tests and logs, e.g.
// "add-rs TCP 10.96.0.10:80 10.244.0.11:8080 w1".
func (o op) String() string {
	s := opNames[o.kind] + " " + o.key.String()
	switch o.kind {
	case opAddVS, opUpdateVS:
		s += " " + o.vs.scheduler
		if o.vs.persistence > 0 {
			s += fmt.Sprintf(" persistent %ds", o.vs.persistence)
		}
	case opAddRS, opUpdateRS:
		s += fmt.Sprintf(" %s w%d", o.real, o.weight)
	case opDrainRS, opDelRS:
		s += " " + o.real.String()
	}
	return s
}

// diff returns the ops that turn the programmed virtual server old into
// want (either may be nil: absent). Real servers come in address order.
// A real server that is no longer wanted is drained (TCP) or deleted
// (UDP, SCTP); a draining one that is wanted again is restored.
func diff(key vsKey, old, want *virtualServer) []op {
	switch {
	case old == nil && want == nil:
		return nil
	case want == nil:
		return []op{{kind: opDelVS, key: key}}
	}
	var ops []op
	if old == nil {
		ops = append(ops, op{kind: opAddVS, key: key, vs: want})
		old = newVirtualServer(want.scheduler, want.persistence)
	} else if !old.sameConfig(want) {
		ops = append(ops, op{kind: opUpdateVS, key: key, vs: want})
	}
	for _, a := range slices.SortedFunc(maps.Keys(want.reals), netip.AddrPort.Compare) {
		w := want.reals[a]
		ow, had := old.reals[a]
		_, draining := old.draining[a]
		switch {
		case !had:
			ops = append(ops, op{kind: opAddRS, key: key, real: a, weight: w})
		case ow != w || draining:
			ops = append(ops, op{kind: opUpdateRS, key: key, real: a, weight: w})
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(old.reals), netip.AddrPort.Compare) {
		if _, wanted := want.reals[a]; wanted {
			continue
		}
		if !key.graceful() {
			ops = append(ops, op{kind: opDelRS, key: key, real: a})
		} else if _, draining := old.draining[a]; !draining {
			ops = append(ops, op{kind: opDrainRS, key: key, real: a})
		}
	}
	return ops
}
