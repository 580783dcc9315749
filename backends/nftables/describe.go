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
		s = fmt.Sprintf("%s . %s . %d . %s-%s", addrAt(e.key, 0, n), protoText(e.key[n]), binary.BigEndian.Uint16(e.key[n+4:]),
			addrAt(e.key, ipKey, n), addrAt(e.keyEnd, ipKey, n))
	case isEndpointsMap(set):
		k := len(e.key) - 4
		s = describe(n, "", element{key: e.key[:k]}) + fmt.Sprintf(" . %d", binaryutil.NativeEndian.Uint32(e.key[k:]))
	case len(e.key) == ipKey:
		s = fmt.Sprintf("%s . %s . %d", addrAt(e.key, 0, n), protoText(e.key[n]), binary.BigEndian.Uint16(e.key[n+4:]))
	case set == setHairpin:
		s = fmt.Sprintf("%s . %s", addrAt(e.key, 0, n), describe(n, "", element{key: e.key[n:]}))
	case len(e.key) == 8:
		s = fmt.Sprintf("%s . %d", protoText(e.key[0]), binary.BigEndian.Uint16(e.key[4:]))
	case e.intervalEnd:
		s = "interval end " + addrAt(e.key, 0, n).String()
	default:
		s = addrAt(e.key, 0, n).String()
	}
	if e.comment != "" {
		// Between key and data, where nft reads and prints it.
		s += fmt.Sprintf(" comment %q", e.comment)
	}
	switch {
	case e.verdict != "":
		s += " : goto " + e.verdict
	case len(e.val) == 4:
		s += fmt.Sprintf(" : %d", binary.BigEndian.Uint32(e.val))
	case len(e.val) == n+4:
		s += fmt.Sprintf(" : %s . %d", addrAt(e.val, 0, n), binary.BigEndian.Uint16(e.val[n:]))
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
