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
	case set == setFirewallAllow:
		s = fmt.Sprintf("%s . %s . %d . %s-%s", addr4(e.Key), protoText(e.Key[4]), binary.BigEndian.Uint16(e.Key[8:]),
			addr4(e.Key[12:]), addr4(e.KeyEnd[12:]))
	case strings.HasPrefix(set, "endpoints-"):
		s = fmt.Sprintf("%d . %d", binary.BigEndian.Uint32(e.Key), binaryutil.NativeEndian.Uint32(e.Key[4:8]))
	case len(e.Key) == 12:
		s = fmt.Sprintf("%s . %s . %d", addr4(e.Key), protoText(e.Key[4]), binary.BigEndian.Uint16(e.Key[8:]))
	case set == setHairpin:
		s = fmt.Sprintf("%s . %s", addr4(e.Key), addr4(e.Key[4:]))
	case len(e.Key) == 8:
		s = fmt.Sprintf("%s . %d", protoText(e.Key[0]), binary.BigEndian.Uint16(e.Key[4:]))
	case e.IntervalEnd:
		s = "interval end " + addr4(e.Key).String()
	default:
		s = addr4(e.Key).String()
	}
	switch {
	case e.VerdictData != nil:
		s += " : goto " + e.VerdictData.Chain
	case len(e.Val) == 4:
		s += fmt.Sprintf(" : %d", binary.BigEndian.Uint32(e.Val))
	case len(e.Val) == 8:
		s += fmt.Sprintf(" : %s . %d", addr4(e.Val), binary.BigEndian.Uint16(e.Val[4:]))
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
