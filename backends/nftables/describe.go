package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"
)

// describe renders an element from its encoded bytes, so golden files show
// exactly what is sent to the kernel.
func describe(set string, e element) string {
	var s string
	switch {
	case strings.HasPrefix(set, "endpoints-"):
		s = fmt.Sprintf("%d . %d", binary.BigEndian.Uint32(e.key), binaryutil.NativeEndian.Uint32(e.key[4:8]))
	case len(e.key) == 12:
		s = fmt.Sprintf("%s . %s . %d", addr4(e.key), protoText(e.key[4]), binary.BigEndian.Uint16(e.key[8:]))
	case set == setHairpin:
		s = fmt.Sprintf("%s . %s", addr4(e.key), addr4(e.key[4:]))
	case len(e.key) == 8:
		s = fmt.Sprintf("%s . %d", protoText(e.key[0]), binary.BigEndian.Uint16(e.key[4:]))
	case e.intervalEnd:
		s = "interval end " + addr4(e.key).String()
	default:
		s = addr4(e.key).String()
	}
	switch {
	case e.verdict != nil:
		s += " : goto " + e.verdict.Chain
	case len(e.val) == 4:
		s += fmt.Sprintf(" : %d", binary.BigEndian.Uint32(e.val))
	case len(e.val) == 8:
		s += fmt.Sprintf(" : %s . %d", addr4(e.val), binary.BigEndian.Uint16(e.val[4:]))
	}
	return s
}

func addr4(b []byte) netip.Addr { return netip.AddrFrom4([4]byte(b[:4])) }

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
