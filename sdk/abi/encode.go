package abi

import (
	"net/netip"
	"slices"

	"github.com/weirproxy/weir/sdk/plan"
)

// Encoder builds batches; it reuses its buffers, so a batch is valid until the next Encode.
//
// The zero Encoder is ready to use. An Encoder is not safe for concurrent use.
type Encoder struct {
	buf  []byte
	strs strTable
	keys []string
}

// Encode writes one version 1 batch holding node's name and zone and the
// services, in order, flagged Full when full is set. Strings are stored
// once each, except pod names (nearly all distinct, so looking them up
// costs more than it saves), and labels and annotations are sorted by key.
// Arrays longer than the ABI's u16 counts allow are truncated; affinity
// timeouts are clamped to MaxAffinitySeconds and unknown schedulers sent
// as the default. Every service must be non-nil.
func (e *Encoder) Encode(node plan.Node, services []*plan.Service, full bool) []byte {
	return e.encode(node, services, full, Version1, nil)
}

// EncodeSignals writes one version 2 batch, as Encode does, with each
// endpoint's signals: signals[i][j] are those of services[i].Endpoints[j];
// a missing entry (signals or signals[i] too short) is zero.
func (e *Encoder) EncodeSignals(node plan.Node, services []*plan.Service, full bool, signals [][]Signals) []byte {
	return e.encode(node, services, full, Version2, signals)
}

// encode writes a batch of version v.
func (e *Encoder) encode(node plan.Node, services []*plan.Service, full bool, v uint16, signals [][]Signals) []byte {
	ep := endpointSize(v)
	size := HeaderSize + 4*len(services)
	strBytes := len(node.Name) + len(node.Zone)
	for _, s := range services {
		size += shapeOf(s, ep).size()
		strBytes += stringBytes(s)
	}
	if cap(e.buf) < size+strBytes {
		e.buf = make([]byte, size, size+strBytes)
	} else {
		e.buf = e.buf[:size]
		clear(e.buf)
	}
	e.strs.reset()

	b := e.buf
	put32(b, hMagic, Magic)
	put16(b, hVersion, v)
	if full {
		put16(b, hFlags, FlagFull)
	}
	put32(b, hCount, uint32(len(services)))
	put32(b, hStrings, uint32(size))
	e.putStr(hNodeName, node.Name)
	e.putStr(hNodeZone, node.Zone)
	off := HeaderSize + 4*len(services)
	for i, s := range services {
		put32(e.buf, HeaderSize+4*i, uint32(off))
		var sig []Signals
		if i < len(signals) {
			sig = signals[i]
		}
		off += e.service(off, s, ep, sig)
	}
	return e.buf
}

// stringBytes estimates the string bytes a service adds, without iterating
// its labels and annotations (the buffer grows if they need more).
func stringBytes(s *plan.Service) int {
	n := len(s.Key.Namespace) + len(s.Key.Name) + len(s.Key.Port) + 32*(len(s.Labels)+len(s.Annotations))
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		n += len(ep.NodeName) + len(ep.Zone) + len(ep.Pod)
	}
	return n
}

// putStr appends str to the string area (unless already there) and writes
// its descriptor at off.
func (e *Encoder) putStr(off int, str string) {
	if str == "" {
		return
	}
	h := e.strs.hash(str)
	o, slot := e.strs.find(e.buf, str, h)
	if o == 0 {
		o = uint32(len(e.buf))
		e.buf = append(e.buf, str...)
		e.strs.add(slot, h, o, len(str))
	}
	put32(e.buf, off, o)
	put32(e.buf, off+4, uint32(len(str)))
}

// service writes s's record, with endpoint records of ep bytes and the
// endpoints' signals when ep has room for them, at off and returns its size.
func (e *Encoder) service(off int, s *plan.Service, ep int, signals []Signals) int {
	sh := shapeOf(s, ep)
	b := e.buf
	put32(b, off+sSize, uint32(sh.size()))
	b[off+sProtocol] = protocolCode(s.Key.Protocol)
	b[off+sScheduler] = schedulerCode(s.Scheduler)
	put16(b, off+sFlags, serviceFlags(s))
	put16(b, off+sPort, s.Port)
	put16(b, off+sNodePort, s.NodePort)
	put16(b, off+sHealthPort, s.HealthCheckNodePort)
	put32(b, off+sAffinity, affinitySeconds(s.Affinity))
	put32(b, off+sEndpoints, uint32(sh.endpoints))
	put16(b, off+sClusterIPs, uint16(sh.clusterIPs))
	put16(b, off+sExternalIPs, uint16(sh.externalIPs))
	put16(b, off+sLBIPs, uint16(sh.lbIPs))
	put16(b, off+sRanges, uint16(sh.ranges))
	put16(b, off+sLabels, uint16(sh.labels))
	put16(b, off+sAnnotations, uint16(sh.annotations))
	put32(b, off+sEndpointsOff, uint32(sh.endpointsOff()))
	e.putStr(off+sNamespace, s.Key.Namespace)
	e.putStr(off+sName, s.Key.Name)
	e.putStr(off+sPortName, s.Key.Port)

	b = e.buf // putStr may have grown the buffer
	p := off + ServiceHeaderSize
	for _, list := range [...][]netip.Addr{
		s.ClusterIPs[:sh.clusterIPs], s.ExternalIPs[:sh.externalIPs], s.LoadBalancerIPs[:sh.lbIPs],
	} {
		for _, a := range list {
			ab := addrBytes(a)
			copy(b[p:], ab[:])
			p += addrSize
		}
	}
	for _, r := range s.SourceRanges[:sh.ranges] {
		rb := prefixBytes(r)
		copy(b[p:], rb[:])
		p += rangeSize
	}
	p = e.pairs(p, s.Labels, sh.labels)
	e.pairs(p, s.Annotations, sh.annotations)

	p = off + sh.endpointsOff()
	for i := range s.Endpoints {
		e.endpoint(p, uint32(i), &s.Endpoints[i])
		if ep == EndpointSizeV2 && i < len(signals) {
			put32(e.buf, p+eActive, signals[i].Active)
			put32(e.buf, p+eNew, signals[i].New)
		}
		p += ep
	}
	return sh.size()
}

// pairs writes the first n entries of m in key order at off and returns the offset after them.
func (e *Encoder) pairs(off int, m map[string]string, n int) int {
	if n == 0 {
		return off
	}
	e.keys = e.keys[:0]
	for k := range m {
		e.keys = append(e.keys, k)
	}
	slices.Sort(e.keys)
	for _, k := range e.keys[:n] {
		e.putStr(off, k)
		e.putStr(off+strSize, m[k])
		off += pairSize
	}
	clear(e.keys) // do not keep the caller's strings alive
	return off
}

// endpoint writes one endpoint record at off.
func (e *Encoder) endpoint(off int, id uint32, ep *plan.Endpoint) {
	b := e.buf
	ab := addrBytes(ep.Address)
	copy(b[off+eAddr:], ab[:])
	put16(b, off+ePort, ep.Port)
	put16(b, off+eFlags, endpointFlags(ep))
	put32(b, off+eWeight, ep.Weight)
	put32(b, off+eID, id)
	e.putStr(off+eNode, ep.NodeName)
	e.putStr(off+eZone, ep.Zone)
	if ep.Pod != "" {
		put32(e.buf, off+ePod, uint32(len(e.buf)))
		put32(e.buf, off+ePod+4, uint32(len(ep.Pod)))
		e.buf = append(e.buf, ep.Pod...)
	}
}
