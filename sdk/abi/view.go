package abi

import (
	"errors"
	"net/netip"
	"sort"
	"strconv"

	"github.com/weirproxy/weir/sdk/plan"
)

// Batch is the guest's view of one batch; accessors read and write the buffer in place.
//
// Strings returned by the views share the buffer's memory rather than copy
// it. In a plugin every batch has a buffer of its own, so they stay valid;
// code that reuses a buffer for the next batch must strings.Clone the ones
// it keeps.
type Batch struct {
	buf []byte
	n   int
	ep  int // endpoint record size
}

// Parse checks magic, version (1 or 2), and that every record, array and string lies
// inside buf, so accessors never go out of bounds afterwards (an endpoint's
// strings are checked when read: one outside buf reads as empty). It also checks
// that the records come in order without overlapping, as Weir writes them,
// which bounds its work by the size of buf. The batch edits buf in place.
func Parse(buf []byte) (*Batch, error) {
	n, err := check(buf)
	if err != nil {
		return nil, err
	}
	return &Batch{buf: buf, n: n, ep: endpointSize(u16(buf, hVersion))}, nil
}

// Version returns the batch's ABI version: 2 when it carries signals.
func (b *Batch) Version() uint16 { return u16(b.buf, hVersion) }

// Bytes returns the batch's buffer, with the edits made through its views.
func (b *Batch) Bytes() []byte { return b.buf }

// Full reports whether the batch holds every service the plugin matches.
func (b *Batch) Full() bool { return u16(b.buf, hFlags)&FlagFull != 0 }

// NodeName returns the name of the node Weir runs on.
func (b *Batch) NodeName() string { return strAt(b.buf, hNodeName) }

// NodeZone returns the node's zone, or "" when it has none.
func (b *Batch) NodeZone() string { return strAt(b.buf, hNodeZone) }

// Len returns the number of services in the batch.
func (b *Batch) Len() int { return b.n }

// Service returns a view of service i; it panics when i is out of range.
func (b *Batch) Service(i int) Service {
	if i < 0 || i >= b.n {
		outOfRange("service", i, b.n)
	}
	return Service{buf: b.buf, off: int(u32(b.buf, HeaderSize+4*i)), ep: b.ep}
}

// outOfRange panics for an index out of range; kept out of the accessors so
// that they inline (in a plugin every call costs a check of the deadline).
//
//go:noinline
func outOfRange(what string, i, n int) {
	panic("abi: " + what + " index " + strconv.Itoa(i) + " out of range [0," + strconv.Itoa(n) + ")")
}

// check validates a batch's bounds and returns its number of services.
func check(buf []byte) (int, error) {
	if len(buf) < HeaderSize {
		return 0, errors.New("abi: batch of " + strconv.Itoa(len(buf)) + " bytes is shorter than its header")
	}
	if m := u32(buf, hMagic); m != Magic {
		return 0, errors.New("abi: bad magic 0x" + strconv.FormatUint(uint64(m), 16))
	}
	v := u16(buf, hVersion)
	if v != Version1 && v != Version2 {
		return 0, errors.New("abi: batch version " + strconv.Itoa(int(v)) + ", want 1 or 2")
	}
	n := uint64(u32(buf, hCount))
	if HeaderSize+4*n > uint64(len(buf)) {
		return 0, errors.New("abi: record table of " + strconv.FormatUint(n, 10) + " services is outside the batch")
	}
	if uint64(u32(buf, hStrings)) > uint64(len(buf)) {
		return 0, errors.New("abi: string area offset is outside the batch")
	}
	if !strOK(buf, hNodeName) || !strOK(buf, hNodeZone) {
		return 0, errors.New("abi: node name or zone is outside the batch")
	}
	end := HeaderSize + 4*int(n)
	for i := range int(n) {
		off := int(u32(buf, HeaderSize+4*i))
		var reason string
		if off < end {
			reason = "record offset " + strconv.Itoa(off) + " overlaps the record table or the previous record"
		} else {
			reason = checkRecord(buf, off, endpointSize(v))
		}
		if reason != "" {
			return 0, errors.New("abi: service " + strconv.Itoa(i) + ": " + reason)
		}
		end = off + int(u32(buf, off+sSize))
	}
	return int(n), nil
}

// checkRecord checks that the record at off, its arrays and its strings lie
// inside buf; it returns what is wrong, or "".
func checkRecord(buf []byte, off, ep int) string {
	if off%4 != 0 {
		return "record offset " + strconv.Itoa(off) + " is not a multiple of 4"
	}
	if uint64(off)+ServiceHeaderSize > uint64(len(buf)) {
		return "record offset " + strconv.Itoa(off) + " is outside the batch"
	}
	size := uint64(u32(buf, off+sSize))
	if uint64(off)+size > uint64(len(buf)) {
		return "record size " + strconv.FormatUint(size, 10) + " goes past the batch's end"
	}
	sh := shapeAt(buf, off, ep)
	eoff := uint64(u32(buf, off+sEndpointsOff))
	switch {
	case eoff < uint64(sh.endpointsOff()) || eoff%4 != 0:
		return "endpoint array offset " + strconv.FormatUint(eoff, 10) + " overlaps the arrays before it or is unaligned"
	case eoff+uint64(ep)*uint64(sh.endpoints) > size:
		return "endpoint array of " + strconv.Itoa(sh.endpoints) + " endpoints goes past the record's size"
	}
	for _, s := range [...]int{sNamespace, sName, sPortName} {
		if !strOK(buf, off+s) {
			return "key string is outside the batch"
		}
	}
	for p := off + sh.pairsOff(); p < off+sh.endpointsOff(); p += strSize {
		if !strOK(buf, p) {
			return "label or annotation string is outside the batch"
		}
	}
	// Endpoint strings are checked when read (Endpoint.str), not here: a
	// batch holds hundreds of thousands and most plugins read few of them.
	return ""
}

// Service is a view of one service record in a batch.
type Service struct {
	buf []byte
	off int
	ep  int // endpoint record size
}

// Key returns the service port's key.
func (s Service) Key() plan.Key {
	return plan.Key{Namespace: s.Namespace(), Name: s.Name(), Port: s.PortName(), Protocol: s.Protocol()}
}

// Namespace returns the service's namespace.
func (s Service) Namespace() string { return strAt(s.buf, s.off+sNamespace) }

// Name returns the service's name.
func (s Service) Name() string { return strAt(s.buf, s.off+sName) }

// PortName returns the service port's name, possibly empty.
func (s Service) PortName() string { return strAt(s.buf, s.off+sPortName) }

// Protocol returns the port's protocol, or "" for an unknown code.
func (s Service) Protocol() plan.Protocol { return protocolOf(s.buf[s.off+sProtocol]) }

// Port returns the service port.
func (s Service) Port() uint16 { return u16(s.buf, s.off+sPort) }

// NodePort returns the node port, 0 if none.
func (s Service) NodePort() uint16 { return u16(s.buf, s.off+sNodePort) }

// HealthCheckNodePort returns the health-check node port, 0 if none.
func (s Service) HealthCheckNodePort() uint16 { return u16(s.buf, s.off+sHealthPort) }

// ExternalLocal reports externalTrafficPolicy: Local.
func (s Service) ExternalLocal() bool { return u16(s.buf, s.off+sFlags)&svcExternalLocal != 0 }

// InternalLocal reports internalTrafficPolicy: Local.
func (s Service) InternalLocal() bool { return u16(s.buf, s.off+sFlags)&svcInternalLocal != 0 }

func (s Service) shape() shape { return shapeAt(s.buf, s.off, s.ep) }

func (s Service) addrs(from, n int) []netip.Addr {
	if n == 0 {
		return nil
	}
	out := make([]netip.Addr, n)
	p := s.off + ServiceHeaderSize + addrSize*from
	for i := range out {
		out[i] = addrAt(s.buf, p+addrSize*i)
	}
	return out
}

// ClusterIPs returns the service's cluster IPs.
func (s Service) ClusterIPs() []netip.Addr { return s.addrs(0, s.shape().clusterIPs) }

// ExternalIPs returns the service's external IPs.
func (s Service) ExternalIPs() []netip.Addr {
	sh := s.shape()
	return s.addrs(sh.clusterIPs, sh.externalIPs)
}

// LoadBalancerIPs returns the load-balancer IPs this node captures.
func (s Service) LoadBalancerIPs() []netip.Addr {
	sh := s.shape()
	return s.addrs(sh.clusterIPs+sh.externalIPs, sh.lbIPs)
}

// SourceRanges returns the ranges allowed to reach the load-balancer IPs.
func (s Service) SourceRanges() []netip.Prefix {
	sh := s.shape()
	if sh.ranges == 0 {
		return nil
	}
	out := make([]netip.Prefix, sh.ranges)
	for i := range out {
		out[i] = prefixAt(s.buf, s.off+sh.rangesOff()+rangeSize*i)
	}
	return out
}

// Label returns the value of the service's label key.
func (s Service) Label(key string) (string, bool) {
	sh := s.shape()
	return s.lookup(s.off+sh.pairsOff(), sh.labels, key)
}

// Annotation returns the value of the service's annotation key.
func (s Service) Annotation(key string) (string, bool) {
	sh := s.shape()
	return s.lookup(s.off+sh.pairsOff()+pairSize*sh.labels, sh.annotations, key)
}

// lookup binary-searches n key-sorted pairs at off.
func (s Service) lookup(off, n int, key string) (string, bool) {
	i := sort.Search(n, func(i int) bool {
		k, _ := strBytes(s.buf, off+pairSize*i)
		return string(k) >= key
	})
	if i == n {
		return "", false
	}
	if k, _ := strBytes(s.buf, off+pairSize*i); string(k) != key {
		return "", false
	}
	return strAt(s.buf, off+pairSize*i+strSize), true
}

// AffinitySeconds returns the ClientIP affinity timeout; 0 = none.
func (s Service) AffinitySeconds() uint32 { return u32(s.buf, s.off+sAffinity) }

// SetAffinity sets the affinity timeout; 0 clears; values above MaxAffinitySeconds are clamped.
func (s Service) SetAffinity(seconds uint32) {
	put32(s.buf, s.off+sAffinity, min(seconds, MaxAffinitySeconds))
}

// Scheduler returns the scheduler hint, or "" for an unknown code.
func (s Service) Scheduler() plan.Scheduler {
	if c := int(s.buf[s.off+sScheduler]); c < len(plan.Schedulers) {
		return plan.Schedulers[c]
	}
	return plan.SchedulerDefault
}

// SetScheduler sets the scheduler hint; it fails for a scheduler not in plan.Schedulers.
func (s Service) SetScheduler(sched plan.Scheduler) error {
	for i, x := range plan.Schedulers {
		if x == sched {
			s.buf[s.off+sScheduler] = byte(i)
			return nil
		}
	}
	return errors.New("abi: unknown scheduler " + strconv.Quote(string(sched)))
}

// Len returns the number of endpoints.
func (s Service) Len() int { return int(u32(s.buf, s.off+sEndpoints)) }

func (s Service) slot(i int) int {
	return s.off + int(u32(s.buf, s.off+sEndpointsOff)) + s.ep*i
}

// Endpoint returns a view of slot i (after Swap/Keep the slot may hold
// another endpoint); it panics when i is out of range.
func (s Service) Endpoint(i int) Endpoint {
	if n := s.Len(); i < 0 || i >= n {
		outOfRange("endpoint", i, n)
	}
	p := s.slot(i)
	return Endpoint{buf: s.buf, rec: s.buf[p : p+s.ep : p+s.ep]}
}

// Swap exchanges the endpoints in slots i and j.
func (s Service) Swap(i, j int) {
	a, b := s.Endpoint(i).rec, s.Endpoint(j).rec
	var tmp [EndpointSizeV2]byte
	copy(tmp[:], a)
	copy(a, b)
	copy(b, tmp[:len(b)])
}

// SortEndpoints sorts the endpoints by less, keeping equal ones in order.
func (s Service) SortEndpoints(less func(a, b Endpoint) bool) {
	n := s.Len()
	if n < 2 {
		return
	}
	arr := s.buf[s.slot(0):s.slot(n)]
	orig := make([]byte, len(arr))
	copy(orig, arr)
	o := &ordering{buf: s.buf, orig: orig, ep: s.ep, idx: make([]int, n), less: less}
	for i := range o.idx {
		o.idx[i] = i
	}
	sort.Stable(o)
	for to, from := range o.idx {
		copy(arr[s.ep*to:], orig[s.ep*from:s.ep*(from+1)])
	}
}

// ordering sorts slot indices by comparing copies of the endpoint records.
type ordering struct {
	buf, orig []byte
	ep        int
	idx       []int
	less      func(a, b Endpoint) bool
}

func (o *ordering) Len() int      { return len(o.idx) }
func (o *ordering) Swap(i, j int) { o.idx[i], o.idx[j] = o.idx[j], o.idx[i] }
func (o *ordering) Less(i, j int) bool {
	return o.less(o.view(o.idx[i]), o.view(o.idx[j]))
}

func (o *ordering) view(k int) Endpoint {
	p := o.ep * k
	return Endpoint{buf: o.buf, rec: o.orig[p : p+o.ep : p+o.ep]}
}

// Keep drops the endpoints keep rejects, preserving order; it returns the new Len.
func (s Service) Keep(keep func(e Endpoint) bool) int {
	n, w := s.Len(), 0
	for i := range n {
		e := s.Endpoint(i)
		if !keep(e) {
			continue
		}
		if w != i {
			copy(s.Endpoint(w).rec, e.rec)
		}
		w++
	}
	put32(s.buf, s.off+sEndpoints, uint32(w))
	return w
}

// Endpoint is a view of one endpoint record.
type Endpoint struct {
	buf []byte // the batch, for strings
	rec []byte // the record: 52 bytes, or 60 in version 2
}

// ID returns the endpoint's index in the batch Weir sent.
func (e Endpoint) ID() uint32 { return u32(e.rec, eID) }

// Address returns the endpoint's address.
func (e Endpoint) Address() netip.Addr { return addrAt(e.rec, eAddr) }

// Port returns the endpoint's port.
func (e Endpoint) Port() uint16 { return u16(e.rec, ePort) }

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Address(), e.Port()) }

func (e Endpoint) str(off int) string {
	o, n := u32(e.rec, off), u32(e.rec, off+4)
	if uint64(o)+uint64(n) > uint64(len(e.buf)) {
		return ""
	}
	return viewString(e.buf, o, n)
}

// NodeName returns the name of the endpoint's node.
func (e Endpoint) NodeName() string { return e.str(eNode) }

// Zone returns the endpoint's zone.
func (e Endpoint) Zone() string { return e.str(eZone) }

// Pod returns the endpoint's pod name, or "".
func (e Endpoint) Pod() string { return e.str(ePod) }

func (e Endpoint) flag(bit uint16) bool { return u16(e.rec, eFlags)&bit != 0 }

// Ready reports whether the endpoint is ready.
func (e Endpoint) Ready() bool { return e.flag(epReady) }

// Serving reports whether the endpoint is serving.
func (e Endpoint) Serving() bool { return e.flag(epServing) }

// Terminating reports whether the endpoint's pod is shutting down.
func (e Endpoint) Terminating() bool { return e.flag(epTerminating) }

// Local reports whether the endpoint runs on this node.
func (e Endpoint) Local() bool { return e.flag(epLocal) }

// ForCluster reports whether the endpoint serves Cluster-policy traffic.
func (e Endpoint) ForCluster() bool { return e.flag(epForCluster) }

// ForLocal reports whether the endpoint serves Local-policy traffic.
func (e Endpoint) ForLocal() bool { return e.flag(epForLocal) }

// Weight returns the endpoint's share of new connections; 0 drains.
func (e Endpoint) Weight() uint32 { return u32(e.rec, eWeight) }

// SetWeight sets the endpoint's weight; 0 drains it.
func (e Endpoint) SetWeight(w uint32) { put32(e.rec, eWeight, w) }

// Active returns the number of connections open to the endpoint through
// Weir's rules on this node, when the batch carries signals (version 2),
// else 0.
func (e Endpoint) Active() uint32 { return e.signal(eActive) }

// New returns the number of connections opened to the endpoint since the
// previous reading of the signals, when the batch carries them, else 0.
func (e Endpoint) New() uint32 { return e.signal(eNew) }

func (e Endpoint) signal(off int) uint32 {
	if len(e.rec) < EndpointSizeV2 {
		return 0
	}
	return u32(e.rec, off)
}
