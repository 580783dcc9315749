package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/moby/ipvs"
	"golang.org/x/sys/unix"
)

// IPVS generic-netlink commands and attributes (include/uapi/linux/ip_vs.h).
const (
	ipvsGenlVersion = 1

	cmdNewService = 1
	cmdSetService = 2
	cmdDelService = 3
	cmdGetService = 4
	cmdNewDest    = 5
	cmdSetDest    = 6
	cmdDelDest    = 7
	cmdGetDest    = 8

	attrService = 1 // IPVS_CMD_ATTR_SERVICE, nested
	attrDest    = 2 // IPVS_CMD_ATTR_DEST, nested

	svcAF       = 1
	svcProtocol = 2
	svcAddr     = 3
	svcPort     = 4
	svcFWMark   = 5
	svcSched    = 6
	svcFlags    = 7
	svcTimeout  = 8
	svcNetmask  = 9

	destAddr     = 1
	destPort     = 2
	destFwd      = 3
	destWeight   = 4
	destUThresh  = 5
	destLThresh  = 6
	destActive   = 7
	destInactive = 8
	destStats    = 10 // nested, 32-bit counters
	destAF       = 11
	destStats64  = 12 // nested, 64-bit counters (Linux 4.1 on)

	// statsConns is the number of connections scheduled, inside
	// destStats and destStats64.
	statsConns = 1

	// fwdMasq is IP_VS_CONN_F_MASQ, the NAT forwarding method.
	fwdMasq = 0
	// nlaTypeMask strips the nested and byte-order flags off an
	// attribute type.
	nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

var native = binary.NativeEndian

// beginMsg appends a netlink header (length filled by endMsg) and a
// generic-netlink header for cmd, and returns where the message starts.
func beginMsg(b []byte, family, flags uint16, seq uint32, cmd uint8) ([]byte, int) {
	at := len(b)
	b = native.AppendUint32(b, 0)
	b = native.AppendUint16(b, family)
	b = native.AppendUint16(b, flags)
	b = native.AppendUint32(b, seq)
	b = native.AppendUint32(b, 0) // port id: the kernel's
	return append(b, cmd, ipvsGenlVersion, 0, 0), at
}

// endMsg writes the length of the message that starts at at.
func endMsg(b []byte, at int) {
	native.PutUint32(b[at:], uint32(len(b)-at))
}

// attrHeader appends the header of an attribute with n bytes of data.
func attrHeader(b []byte, typ uint16, n int) []byte {
	b = native.AppendUint16(b, uint16(unix.NLA_HDRLEN+n))
	return native.AppendUint16(b, typ)
}

// pad appends zeros up to the next four-byte boundary.
func pad(b []byte) []byte {
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func putU16(b []byte, typ, v uint16) []byte {
	return pad(native.AppendUint16(attrHeader(b, typ, 2), v))
}

func putU32(b []byte, typ uint16, v uint32) []byte {
	return native.AppendUint32(attrHeader(b, typ, 4), v)
}

// putPort appends a port in network byte order.
func putPort(b []byte, typ, port uint16) []byte {
	return pad(binary.BigEndian.AppendUint16(attrHeader(b, typ, 2), port))
}

// putString appends a NUL-terminated string.
func putString(b []byte, typ uint16, s string) []byte {
	b = append(attrHeader(b, typ, len(s)+1), s...)
	return pad(append(b, 0))
}

// putAddr appends a as the kernel's union nf_inet_addr (16 bytes, IPv4
// in the first four).
func putAddr(b []byte, typ uint16, a netip.Addr) []byte {
	b = attrHeader(b, typ, 16)
	if a.Is4() {
		v := a.As4()
		return append(append(b, v[:]...), make([]byte, 12)...)
	}
	v := a.As16()
	return append(b, v[:]...)
}

// beginNest appends the header of a nested attribute; endNest fills its
// length.
func beginNest(b []byte, typ uint16) ([]byte, int) {
	return attrHeader(b, typ, 0), len(b)
}

func endNest(b []byte, at int) { native.PutUint16(b[at:], uint16(len(b)-at)) }

// putService appends the service attribute of k; with vs, the settings
// too (the kernel wants them to add or change a virtual server).
func putService(b []byte, k vsKey, vs *virtualServer) []byte {
	b, at := beginNest(b, attrService)
	b = putU16(b, svcAF, family(k.addr))
	if k.mark != 0 {
		b = putU32(b, svcFWMark, k.mark)
	} else {
		b = putU16(b, svcProtocol, protoNumber(k.proto))
		b = putAddr(b, svcAddr, k.addr)
		b = putPort(b, svcPort, k.port)
	}
	if vs != nil {
		var flags, timeout uint32
		if vs.persistence > 0 {
			flags, timeout = flagPersistent, vs.persistence
		}
		netmask := uint32(0xffffffff)
		if k.addr.Is6() {
			netmask = 128 // a prefix length for IPv6
		}
		b = putString(b, svcSched, vs.scheduler)
		b = native.AppendUint32(native.AppendUint32(attrHeader(b, svcFlags, 8), flags), 0xffffffff)
		b = putU32(b, svcTimeout, timeout)
		b = putU32(b, svcNetmask, netmask)
	}
	endNest(b, at)
	return b
}

// putDest appends the attribute of a masquerading real server.
func putDest(b []byte, a netip.AddrPort, weight int32) []byte {
	b, at := beginNest(b, attrDest)
	b = putAddr(b, destAddr, a.Addr())
	b = putPort(b, destPort, a.Port())
	b = putU32(b, destFwd, fwdMasq)
	b = putU32(b, destWeight, uint32(weight))
	b = putU32(b, destUThresh, 0)
	b = putU32(b, destLThresh, 0)
	b = putU16(b, destAF, family(a.Addr()))
	endNest(b, at)
	return b
}

// opCommand returns the command that performs o; retry gives the update
// that replaces an add answered with EEXIST.
func opCommand(o op, retry bool) uint8 {
	switch o.kind {
	case opAddVS:
		if retry {
			return cmdSetService
		}
		return cmdNewService
	case opUpdateVS:
		return cmdSetService
	case opDelVS:
		return cmdDelService
	case opAddRS:
		if retry {
			return cmdSetDest
		}
		return cmdNewDest
	case opUpdateRS, opDrainRS:
		return cmdSetDest
	}
	return cmdDelDest
}

// appendOp appends the acknowledged request that performs o.
func appendOp(b []byte, fam uint16, seq uint32, o op, retry bool) []byte {
	cmd := opCommand(o, retry)
	b, at := beginMsg(b, fam, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, cmd)
	switch cmd {
	case cmdNewService, cmdSetService:
		b = putService(b, o.key, o.vs)
	default:
		b = putService(b, o.key, nil)
	}
	switch cmd {
	case cmdNewDest, cmdSetDest, cmdDelDest:
		b = putDest(b, o.real, o.weight)
	}
	endMsg(b, at)
	return b
}

// attr is one decoded netlink attribute.
type attr struct {
	typ  uint16
	data []byte
}

// parseAttrs splits b into attributes.
func parseAttrs(b []byte) ([]attr, error) {
	var out []attr
	for len(b) >= unix.NLA_HDRLEN {
		n := int(native.Uint16(b))
		if n < unix.NLA_HDRLEN || n > len(b) {
			return nil, errors.New("ipvs: malformed netlink attribute")
		}
		out = append(out, attr{typ: native.Uint16(b[2:]) & nlaTypeMask, data: b[unix.NLA_HDRLEN:n]})
		n = (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if n > len(b) {
			break
		}
		b = b[n:]
	}
	return out, nil
}

// nested returns the attributes inside the top-level attribute typ of a
// generic-netlink payload (after its four-byte header).
func nested(payload []byte, typ uint16) ([]attr, error) {
	if len(payload) < 4 {
		return nil, errors.New("ipvs: short generic netlink message")
	}
	top, err := parseAttrs(payload[4:])
	if err != nil {
		return nil, err
	}
	for _, a := range top {
		if a.typ == typ {
			return parseAttrs(a.data)
		}
	}
	return nil, fmt.Errorf("ipvs: netlink message without attribute %d", typ)
}

// u16, u32 read native-endian numbers, zero when the attribute is short.
func u16(b []byte) uint16 {
	if len(b) < 2 {
		return 0
	}
	return native.Uint16(b)
}

func u32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return native.Uint32(b)
}

func be16(b []byte) uint16 {
	if len(b) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

// ipOf returns the address bytes of an nf_inet_addr of family af.
func ipOf(b []byte, af uint16) []byte {
	n := 16
	if af == unix.AF_INET {
		n = 4
	}
	if len(b) < n {
		return nil
	}
	return append([]byte(nil), b[:n]...)
}

// decodeService reads one virtual server of a GET_SERVICE dump.
func decodeService(payload []byte) (*ipvs.Service, error) {
	attrs, err := nested(payload, attrService)
	if err != nil {
		return nil, err
	}
	s := &ipvs.Service{}
	var addr []byte
	for _, a := range attrs {
		switch a.typ {
		case svcAF:
			s.AddressFamily = u16(a.data)
		case svcProtocol:
			s.Protocol = u16(a.data)
		case svcAddr:
			addr = a.data
		case svcPort:
			s.Port = be16(a.data)
		case svcFWMark:
			s.FWMark = u32(a.data)
		case svcSched:
			s.SchedName = cString(a.data)
		case svcFlags:
			s.Flags = u32(a.data)
		case svcTimeout:
			s.Timeout = u32(a.data)
		case svcNetmask:
			s.Netmask = u32(a.data)
		}
	}
	if addr != nil {
		s.Address = ipOf(addr, s.AddressFamily)
	}
	return s, nil
}

// decodeDest reads one real server of a GET_DEST dump; af is its virtual
// server's family, for kernels that do not send the real server's.
func decodeDest(payload []byte, af uint16) (*ipvs.Destination, error) {
	attrs, err := nested(payload, attrDest)
	if err != nil {
		return nil, err
	}
	return destFromAttrs(attrs, af), nil
}

// destFromAttrs reads one real server from the attributes inside its
// IPVS_CMD_ATTR_DEST; af as for decodeDest.
func destFromAttrs(attrs []attr, af uint16) *ipvs.Destination {
	d := &ipvs.Destination{AddressFamily: af}
	var addr []byte
	for _, a := range attrs {
		switch a.typ {
		case destAddr:
			addr = a.data
		case destPort:
			d.Port = be16(a.data)
		case destFwd:
			d.ConnectionFlags = u32(a.data)
		case destWeight:
			d.Weight = int(u32(a.data))
		case destUThresh:
			d.UpperThreshold = u32(a.data)
		case destLThresh:
			d.LowerThreshold = u32(a.data)
		case destActive:
			d.ActiveConnections = int(u32(a.data))
		case destInactive:
			d.InactiveConnections = int(u32(a.data))
		case destAF:
			d.AddressFamily = u16(a.data)
		}
	}
	d.Address = ipOf(addr, d.AddressFamily)
	return d
}

// scheduledConns returns the cumulative count of connections scheduled to
// a real server, from the attributes inside its IPVS_CMD_ATTR_DEST: the
// 64-bit counter when the kernel sends it, else the 32-bit one; false
// when it sends neither.
func scheduledConns(attrs []attr) (uint64, bool) {
	var conns uint64
	found := false
	for _, a := range attrs {
		switch a.typ {
		case destStats64:
			if v, ok := statsConnsOf(a.data, 8); ok {
				return v, true
			}
		case destStats:
			if v, ok := statsConnsOf(a.data, 4); ok && !found {
				conns, found = v, true
			}
		}
	}
	return conns, found
}

// statsConnsOf returns the connections counter of a nested stats
// attribute whose counters have size bytes (4 or 8).
func statsConnsOf(b []byte, size int) (uint64, bool) {
	stats, err := parseAttrs(b)
	if err != nil {
		return 0, false
	}
	for _, s := range stats {
		switch {
		case s.typ != statsConns || len(s.data) < size:
		case size == 8:
			return native.Uint64(s.data), true
		default:
			return uint64(native.Uint32(s.data)), true
		}
	}
	return 0, false
}

// cString returns b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
