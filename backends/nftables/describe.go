package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
)

func addrLenOf(t *nftables.Table) int {
	if t.Family == nftables.TableFamilyIPv6 {
		return 16
	}
	return 4
}

// describe renders an element from its encoded bytes, so golden files show
// exactly what is sent to the kernel. n is the family's address length.
func describe(n int, set string, e element) string {
	ipKey := n + 8 // address . proto . port
	var s string
	switch {
	case set == setFirewallAllow:
		s = fmt.Sprintf("%s . %s . %d . %s-%s", addrAt(e.Key, 0, n), protoText(e.Key[n]), binary.BigEndian.Uint16(e.Key[n+4:]),
			addrAt(e.Key, ipKey, n), addrAt(e.KeyEnd, ipKey, n))
	case isEndpointsMap(set):
		k := len(e.Key) - 4
		s = describe(n, "", element{Key: e.Key[:k]}) + fmt.Sprintf(" . %d", binaryutil.NativeEndian.Uint32(e.Key[k:]))
	case len(e.Key) == ipKey:
		s = fmt.Sprintf("%s . %s . %d", addrAt(e.Key, 0, n), protoText(e.Key[n]), binary.BigEndian.Uint16(e.Key[n+4:]))
	case set == setHairpin:
		s = fmt.Sprintf("%s . %s", addrAt(e.Key, 0, n), addrAt(e.Key, n, n))
	case len(e.Key) == 8:
		s = fmt.Sprintf("%s . %d", protoText(e.Key[0]), binary.BigEndian.Uint16(e.Key[4:]))
	case e.IntervalEnd:
		s = "interval end " + addrAt(e.Key, 0, n).String()
	default:
		s = addrAt(e.Key, 0, n).String()
	}
	switch {
	case e.VerdictData != nil:
		s += " : goto " + e.VerdictData.Chain
	case len(e.Val) == 4:
		s += fmt.Sprintf(" : %d", binary.BigEndian.Uint32(e.Val))
	case len(e.Val) == n+4:
		s += fmt.Sprintf(" : %s . %d", addrAt(e.Val, 0, n), binary.BigEndian.Uint16(e.Val[n:]))
	}
	if e.Comment != "" {
		s += fmt.Sprintf(" comment %q", e.Comment)
	}
	return s
}

func addrAt(b []byte, off, n int) netip.Addr {
	a, _ := netip.AddrFromSlice(b[off : off+n])
	return a
}

func protoText(n byte) string {
	switch n {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return fmt.Sprint(n)
}

func isEndpointsMap(name string) bool {
	_, ok := parseEndpointsMap(name)
	return ok
}
