// Package trafficset sorts a service's endpoints into the traffic sets the
// backends balance each on its own, for the plugins that re-weight them.
package trafficset

import "github.com/weirproxy/weir/sdk/abi"

// Count is the number of traffic sets: IPv4 and IPv6, each for cluster
// traffic or (when not also for cluster traffic) for local traffic only.
const Count = 4

// Of returns the traffic set of an endpoint, 0 to Count-1, or -1 when it
// carries no traffic (weight 0, or for neither policy) and is left alone.
func Of(e abi.Endpoint) int {
	if e.Weight() == 0 {
		return -1
	}
	i := 0
	if !e.Address().Is4() {
		i = 2
	}
	switch {
	case e.ForCluster():
		return i
	case e.ForLocal():
		return i + 1
	}
	return -1
}
