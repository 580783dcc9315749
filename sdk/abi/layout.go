// Package abi encodes, decodes and validates the batches Weir exchanges with
// its hook plugins, byte for byte as docs/plugin-abi.md specifies.
//
// Weir (the host) uses Encoder and Decode; a plugin (the guest) reads and
// edits a batch in place through Parse and the Batch, Service and Endpoint
// views. DecodeBatch turns a whole batch back into plan values, for tests
// and tools.
package abi

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"unsafe"

	"github.com/weirproxy/weir/sdk/plan"
)

// The fixed numbers of the ABI.
const (
	// Magic is the batch header's first word, the bytes "WEIR".
	Magic uint32 = 0x52494557
	// Version is the newest ABI version this package speaks; it reads and
	// writes both.
	Version uint16 = Version2
	// Version1 is the ABI without signals: 52-byte endpoint records.
	Version1 uint16 = 1
	// Version2 adds each endpoint's live signals: 60-byte endpoint records,
	// the 52 bytes of version 1 followed by the active and new connection
	// counts.
	Version2 uint16 = 2
	// FlagFull marks a batch holding every service the plugin matches.
	FlagFull uint16 = 1
	// HeaderSize is the size of the batch header before the record table.
	HeaderSize = 32
	// ServiceHeaderSize is the size of a service record before its arrays.
	ServiceHeaderSize = 64
	// EndpointSize is the size of an endpoint record in version 1.
	EndpointSize = 52
	// EndpointSizeV2 is the size of an endpoint record in version 2.
	EndpointSizeV2 = 60
	// MaxAffinitySeconds is the longest affinity timeout a plugin may set.
	MaxAffinitySeconds = plan.MaxAffinitySeconds
)

// Status is a plugin call's result code (docs/plugin-abi.md).
type Status uint32

// The status codes of weir_configure and weir_process.
const (
	StatusOK        Status = 0
	StatusBadInput  Status = 1
	StatusPanic     Status = 2
	StatusFailed    Status = 3
	StatusBadConfig Status = 4
)

// String returns the status's name as the ABI document spells it.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusBadInput:
		return "BadInput"
	case StatusPanic:
		return "Panic"
	case StatusFailed:
		return "Failed"
	case StatusBadConfig:
		return "BadConfig"
	}
	return "Status(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// Sizes of the array elements inside a service record.
const (
	strSize   = 8
	addrSize  = 16
	rangeSize = 20
	pairSize  = 16
)

// Header field offsets.
const (
	hMagic    = 0
	hVersion  = 4
	hFlags    = 6
	hCount    = 8
	hStrings  = 12
	hNodeName = 16
	hNodeZone = 24
)

// Service record field offsets.
const (
	sSize         = 0
	sProtocol     = 4
	sScheduler    = 5
	sFlags        = 6
	sPort         = 8
	sNodePort     = 10
	sHealthPort   = 12
	sAffinity     = 16
	sEndpoints    = 20
	sNamespace    = 24
	sName         = 32
	sPortName     = 40
	sClusterIPs   = 48
	sExternalIPs  = 50
	sLBIPs        = 52
	sRanges       = 54
	sLabels       = 56
	sAnnotations  = 58
	sEndpointsOff = 60
)

// Service flag bits.
const (
	svcExternalLocal = 1
	svcInternalLocal = 2
)

// Endpoint record field offsets.
const (
	eAddr   = 0
	ePort   = 16
	eFlags  = 18
	eWeight = 20
	eID     = 24
	eNode   = 28
	eZone   = 36
	ePod    = 44
	eActive = 52 // version 2
	eNew    = 56 // version 2
)

// Signals are one endpoint's live signals, which version 2 batches carry.
type Signals struct {
	// Active is the number of connections open to the endpoint through
	// Weir's rules on this node.
	Active uint32
	// New is the number of connections opened to it since the previous
	// reading of the signals.
	New uint32
}

// endpointSize returns the size of an endpoint record in version v (1 or 2).
func endpointSize(v uint16) int {
	if v >= Version2 {
		return EndpointSizeV2
	}
	return EndpointSize
}

// Endpoint flag bits.
const (
	epReady       = 1
	epServing     = 2
	epTerminating = 4
	epLocal       = 8
	epForCluster  = 16
	epForLocal    = 32
)

var le = binary.LittleEndian

func u16(b []byte, off int) uint16 { return le.Uint16(b[off:]) }
func u32(b []byte, off int) uint32 { return le.Uint32(b[off:]) }

func put16(b []byte, off int, v uint16) { le.PutUint16(b[off:], v) }
func put32(b []byte, off int, v uint32) { le.PutUint32(b[off:], v) }

// strAt returns the string whose (offset, length) descriptor is at off; the
// descriptor must have been bounds-checked. The string shares b's memory
// (no copy: plugins read hundreds of thousands of them per batch), which is
// safe because nothing writes to a batch's string area.
func strAt(b []byte, off int) string {
	return viewString(b, u32(b, off), u32(b, off+4))
}

// viewString returns b[o:o+n] as a string sharing b's memory.
func viewString(b []byte, o, n uint32) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(&b[o], int(n))
}

// strBytes returns the bytes of the string described at off, or false when
// the descriptor or the bytes lie outside b.
func strBytes(b []byte, off int) ([]byte, bool) {
	if off < 0 || off+strSize > len(b) {
		return nil, false
	}
	o, n := uint64(u32(b, off)), uint64(u32(b, off+4))
	if n == 0 {
		return nil, true
	}
	if o+n > uint64(len(b)) {
		return nil, false
	}
	return b[o : o+n], true
}

// strFits reports whether a string at offset o of length n lies inside a buffer of size bytes.
func strFits(o, n uint32, size int) bool { return n == 0 || uint64(o)+uint64(n) <= uint64(size) }

// strOK reports whether the string described at off lies inside b.
func strOK(b []byte, off int) bool {
	_, ok := strBytes(b, off)
	return ok
}

// addrBytes returns the 16-byte form of a: IPv4 mapped; the zero Addr (never
// in a plan) is written as ::.
func addrBytes(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}

// addrAt reads a 16-byte address; IPv4-mapped addresses come back as IPv4.
func addrAt(b []byte, off int) netip.Addr {
	return netip.AddrFrom16([16]byte(b[off : off+addrSize])).Unmap()
}

// prefixBytes returns the 20-byte form of a source range.
func prefixBytes(p netip.Prefix) [rangeSize]byte {
	var r [rangeSize]byte
	if !p.IsValid() {
		return r
	}
	a := addrBytes(p.Addr())
	copy(r[:], a[:])
	r[addrSize] = byte(p.Bits())
	return r
}

// prefixAt reads a 20-byte source range.
func prefixAt(b []byte, off int) netip.Prefix {
	return netip.PrefixFrom(addrAt(b, off), int(b[off+addrSize]))
}

func protocolCode(p plan.Protocol) byte {
	switch p {
	case plan.TCP:
		return 1
	case plan.UDP:
		return 2
	case plan.SCTP:
		return 3
	}
	return 0
}

func protocolOf(code byte) plan.Protocol {
	switch code {
	case 1:
		return plan.TCP
	case 2:
		return plan.UDP
	case 3:
		return plan.SCTP
	}
	return ""
}

// schedulerCode returns s's ABI code; an unknown scheduler is sent as the default.
func schedulerCode(s plan.Scheduler) byte {
	for i, x := range plan.Schedulers {
		if x == s {
			return byte(i)
		}
	}
	return 0
}

// affinitySeconds is the affinity timeout as encoded: 0 for none, clamped to the maximum.
func affinitySeconds(a *plan.Affinity) uint32 {
	if a == nil {
		return 0
	}
	return min(a.TimeoutSeconds, MaxAffinitySeconds)
}

func serviceFlags(s *plan.Service) uint16 {
	return bit(s.ExternalLocal, svcExternalLocal) | bit(s.InternalLocal, svcInternalLocal)
}

func endpointFlags(e *plan.Endpoint) uint16 {
	return bit(e.Ready, epReady) | bit(e.Serving, epServing) | bit(e.Terminating, epTerminating) |
		bit(e.Local, epLocal) | bit(e.ForCluster, epForCluster) | bit(e.ForLocal, epForLocal)
}

// bit returns v when on is set, else 0.
func bit(on bool, v uint16) uint16 {
	if on {
		return v
	}
	return 0
}

// count16 is a u16 array count: longer arrays are truncated to what fits.
func count16(n int) int { return min(n, 0xffff) }

// shape holds a service record's array counts and derived sizes.
type shape struct {
	clusterIPs, externalIPs, lbIPs, ranges, labels, annotations int
	endpoints                                                   int
	ep                                                          int // endpoint record size
}

// shapeOf returns the shape of s's record with endpoint records of ep bytes.
func shapeOf(s *plan.Service, ep int) shape {
	return shape{
		ep:          ep,
		clusterIPs:  count16(len(s.ClusterIPs)),
		externalIPs: count16(len(s.ExternalIPs)),
		lbIPs:       count16(len(s.LoadBalancerIPs)),
		ranges:      count16(len(s.SourceRanges)),
		labels:      count16(len(s.Labels)),
		annotations: count16(len(s.Annotations)),
		endpoints:   len(s.Endpoints),
	}
}

// shapeAt reads the counts of the record at off (64 bytes must be in
// bounds), whose endpoint records are ep bytes.
func shapeAt(b []byte, off, ep int) shape {
	return shape{
		ep:          ep,
		clusterIPs:  int(u16(b, off+sClusterIPs)),
		externalIPs: int(u16(b, off+sExternalIPs)),
		lbIPs:       int(u16(b, off+sLBIPs)),
		ranges:      int(u16(b, off+sRanges)),
		labels:      int(u16(b, off+sLabels)),
		annotations: int(u16(b, off+sAnnotations)),
		endpoints:   int(u32(b, off+sEndpoints)),
	}
}

// addrs is the number of addresses in the record.
func (s shape) addrs() int { return s.clusterIPs + s.externalIPs + s.lbIPs }

// rangesOff is the offset of the source ranges from the record's start.
func (s shape) rangesOff() int { return ServiceHeaderSize + addrSize*s.addrs() }

// pairsOff is the offset of the labels from the record's start.
func (s shape) pairsOff() int { return s.rangesOff() + rangeSize*s.ranges }

// endpointsOff is the offset of the endpoint array from the record's start.
func (s shape) endpointsOff() int { return s.pairsOff() + pairSize*(s.labels+s.annotations) }

// size is the record's size with its arrays.
func (s shape) size() int { return s.endpointsOff() + s.ep*s.endpoints }
