//go:build vm

package ipvs

import (
	"net/netip"

	"github.com/moby/ipvs"
)

// toDestination is the moby/ipvs destination the kernel tests write behind
// the backend's back: a masquerading real server at a with weight.
func toDestination(a netip.AddrPort, weight int32) *ipvs.Destination {
	return &ipvs.Destination{Address: a.Addr().AsSlice(), Port: a.Port(), Weight: int(weight),
		ConnectionFlags: ipvs.ConnectionFlagMasq, AddressFamily: family(a.Addr())}
}
