package abi

import (
	"net/netip"
	"strconv"

	"github.com/weirproxy/weir/sdk/plan"
)

// OutputError says which service (index and key, if known) and field of a plugin's output is not allowed.
type OutputError struct {
	// Service is the service's index in the batch, -1 for the header.
	Service int
	// Key is the service's key as Weir sent it (zero for the header).
	Key plan.Key
	// Field names what is wrong: "magic", "port", "endpoint 2", ...
	Field string
	// Reason says how it is wrong.
	Reason string
}

// Error formats the error as `service 3 (ns/name:port/TCP): field: reason`.
func (e *OutputError) Error() string {
	if e.Service < 0 {
		return "batch header: " + e.Field + ": " + e.Reason
	}
	return "service " + strconv.Itoa(e.Service) + " (" + e.Key.String() + "): " + e.Field + ": " + e.Reason
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// Decode checks a plugin's output against the services it was sent and returns the services
// Weir will use: out[i] is in[i] itself (same pointer) when the plugin left it unchanged,
// otherwise a new *plan.Service (a Clone of in[i] with the new endpoints / affinity / scheduler;
// endpoints are in[i].Endpoints[id] with the new weight). It never modifies in.
// Any violation of docs/plugin-abi.md "What a plugin may change" returns *OutputError.
// The output's length limit is left to the caller. Every service in in must be non-nil and
// in must be the services the batch was encoded from, in order. The output
// must be of version 1, as Encode writes; DecodeVersion reads the others.
func Decode(in []*plan.Service, output []byte) ([]*plan.Service, error) {
	return DecodeVersion(Version1, in, output)
}

// DecodeVersion is Decode for an output of version v, the version of the
// batch the plugin was sent. The signals of a version 2 output are not
// read: a plugin cannot change them.
func DecodeVersion(v uint16, in []*plan.Service, output []byte) ([]*plan.Service, error) {
	if err := decodeHeader(v, len(in), output); err != nil {
		return nil, err
	}
	d := decoder{buf: output, ep: endpointSize(v)}
	out := make([]*plan.Service, len(in))
	for i, s := range in {
		r, err := d.service(i, s)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

func headerError(field, reason string) error {
	return &OutputError{Service: -1, Field: field, Reason: reason}
}

func decodeHeader(version uint16, n int, b []byte) error {
	if len(b) < HeaderSize {
		return headerError("length", itoa(uint64(len(b)))+" bytes is shorter than the header")
	}
	if m := u32(b, hMagic); m != Magic {
		return headerError("magic", "0x"+strconv.FormatUint(uint64(m), 16)+" is not 0x52494557")
	}
	if v := u16(b, hVersion); v != version {
		return headerError("version", itoa(uint64(v))+" is not "+itoa(uint64(version)))
	}
	if c := u32(b, hCount); uint64(c) != uint64(n) {
		return headerError("number of services", itoa(uint64(c))+", "+itoa(uint64(n))+" were sent")
	}
	if HeaderSize+4*uint64(n) > uint64(len(b)) {
		return headerError("record table", "goes past the output's end")
	}
	if uint64(u32(b, hStrings)) > uint64(len(b)) {
		return headerError("string area offset", "is outside the output")
	}
	if !strOK(b, hNodeName) {
		return headerError("node name", "is outside the output")
	}
	if !strOK(b, hNodeZone) {
		return headerError("node zone", "is outside the output")
	}
	return nil
}

// decoder validates one output's service records.
type decoder struct {
	buf  []byte
	ep   int      // endpoint record size
	seen []uint64 // endpoint ids met, for a service whose endpoints moved
}

// service validates the record of in[i] and returns the service Weir uses.
func (d *decoder) service(i int, s *plan.Service) (*plan.Service, error) {
	fail := func(field, reason string) error {
		return &OutputError{Service: i, Key: s.Key, Field: field, Reason: reason}
	}
	b := d.buf
	off := int(u32(b, HeaderSize+4*i))
	sh := shapeOf(s, d.ep)
	if off%4 != 0 || uint64(off)+uint64(sh.size()) > uint64(len(b)) {
		return nil, fail("record offset", itoa(uint64(off))+" is unaligned or the record goes past the output's end")
	}
	if err := d.fixed(off, s, sh, fail); err != nil {
		return nil, err
	}
	if err := d.arrays(off, s, sh, fail); err != nil {
		return nil, err
	}
	aff := u32(b, off+sAffinity)
	if aff > MaxAffinitySeconds {
		return nil, fail("affinity", itoa(uint64(aff))+" seconds is above "+itoa(MaxAffinitySeconds))
	}
	sched := b[off+sScheduler]
	if int(sched) >= len(plan.Schedulers) {
		return nil, fail("scheduler", "unknown code "+itoa(uint64(sched)))
	}
	n := int(u32(b, off+sEndpoints))
	if n > len(s.Endpoints) {
		return nil, fail("number of endpoints", itoa(uint64(n))+" is above the "+itoa(uint64(len(s.Endpoints)))+" sent")
	}
	same, err := d.endpoints(off+sh.endpointsOff(), n, s, fail)
	if err != nil {
		return nil, err
	}
	if same && n == len(s.Endpoints) && aff == affinitySeconds(s.Affinity) && sched == schedulerCode(s.Scheduler) {
		return s, nil
	}
	return d.changed(off+sh.endpointsOff(), n, s, aff, sched), nil
}

// fixed checks the record's fixed fields against s.
func (d *decoder) fixed(off int, s *plan.Service, sh shape, fail func(string, string) error) error {
	b := d.buf
	for _, f := range [...]struct {
		name      string
		got, want uint64
	}{
		{"record size", uint64(u32(b, off+sSize)), uint64(sh.size())},
		{"protocol", uint64(b[off+sProtocol]), uint64(protocolCode(s.Key.Protocol))},
		{"flags", uint64(u16(b, off+sFlags)), uint64(serviceFlags(s))},
		{"port", uint64(u16(b, off+sPort)), uint64(s.Port)},
		{"node port", uint64(u16(b, off+sNodePort)), uint64(s.NodePort)},
		{"health-check node port", uint64(u16(b, off+sHealthPort)), uint64(s.HealthCheckNodePort)},
		{"number of cluster IPs", uint64(u16(b, off+sClusterIPs)), uint64(sh.clusterIPs)},
		{"number of external IPs", uint64(u16(b, off+sExternalIPs)), uint64(sh.externalIPs)},
		{"number of load-balancer IPs", uint64(u16(b, off+sLBIPs)), uint64(sh.lbIPs)},
		{"number of source ranges", uint64(u16(b, off+sRanges)), uint64(sh.ranges)},
		{"number of labels", uint64(u16(b, off+sLabels)), uint64(sh.labels)},
		{"number of annotations", uint64(u16(b, off+sAnnotations)), uint64(sh.annotations)},
		{"endpoint array offset", uint64(u32(b, off+sEndpointsOff)), uint64(sh.endpointsOff())},
	} {
		if f.got != f.want {
			return fail(f.name, "is "+itoa(f.got)+", "+itoa(f.want)+" was sent")
		}
	}
	for _, f := range [...]struct {
		name string
		pos  int
		want string
	}{
		{"namespace", sNamespace, s.Key.Namespace},
		{"name", sName, s.Key.Name},
		{"port name", sPortName, s.Key.Port},
	} {
		got, ok := strBytes(b, off+f.pos)
		if !ok {
			return fail(f.name, "is outside the output")
		}
		if string(got) != f.want {
			return fail(f.name, strconv.Quote(string(got))+" is not "+strconv.Quote(f.want))
		}
	}
	return nil
}

// arrays checks the addresses and source ranges against s, and that the
// label and annotation strings lie inside the output.
func (d *decoder) arrays(off int, s *plan.Service, sh shape, fail func(string, string) error) error {
	b := d.buf
	p := off + ServiceHeaderSize
	for _, l := range [...]struct {
		name  string
		addrs []netip.Addr
	}{
		{"cluster IP", s.ClusterIPs[:sh.clusterIPs]},
		{"external IP", s.ExternalIPs[:sh.externalIPs]},
		{"load-balancer IP", s.LoadBalancerIPs[:sh.lbIPs]},
	} {
		for j, a := range l.addrs {
			if want := addrBytes(a); [16]byte(b[p:p+addrSize]) != want {
				return fail(l.name+" "+strconv.Itoa(j), addrAt(b, p).String()+" is not "+a.String())
			}
			p += addrSize
		}
	}
	for j, r := range s.SourceRanges[:sh.ranges] {
		if want := prefixBytes(r); [addrSize + 1]byte(b[p:p+addrSize+1]) != [addrSize + 1]byte(want[:addrSize+1]) {
			return fail("source range "+strconv.Itoa(j), prefixAt(b, p).String()+" is not "+r.String())
		}
		p += rangeSize
	}
	for ; p < off+sh.endpointsOff(); p += strSize {
		if !strOK(b, p) {
			return fail("labels and annotations", "a string is outside the output")
		}
	}
	return nil
}

// endpoints checks the n endpoint records at p against s.Endpoints and
// reports whether every slot still holds its own endpoint with its weight.
func (d *decoder) endpoints(p, n int, s *plan.Service, fail func(string, string) error) (bool, error) {
	b := d.buf
	same, inPlace := true, true
	for j := range n {
		rec := b[p+d.ep*j : p+d.ep*(j+1)]
		id := u32(rec, eID)
		if uint64(id) >= uint64(len(s.Endpoints)) {
			return false, fail("endpoint "+strconv.Itoa(j), "id "+itoa(uint64(id))+" is out of range [0,"+itoa(uint64(len(s.Endpoints)))+")")
		}
		if inPlace && int(id) != j {
			same, inPlace = false, false
			d.resetSeen(len(s.Endpoints), j)
		}
		if !inPlace {
			w, bit := id/64, uint64(1)<<(id%64)
			if d.seen[w]&bit != 0 {
				return false, fail("endpoint "+strconv.Itoa(j), "id "+itoa(uint64(id))+" is repeated")
			}
			d.seen[w] |= bit
		}
		want := &s.Endpoints[id]
		if err := checkEndpoint(rec, b, want, id); err != "" {
			return false, fail("endpoint "+strconv.Itoa(j), err)
		}
		if u32(rec, eWeight) != want.Weight {
			same = false
		}
	}
	return same, nil
}

// resetSeen prepares the id set for n endpoints, marking ids 0..j-1 (the slots
// that held their own endpoints) as met.
func (d *decoder) resetSeen(n, j int) {
	words := (n + 63) / 64
	if cap(d.seen) < words {
		d.seen = make([]uint64, words)
	} else {
		d.seen = d.seen[:words]
		clear(d.seen)
	}
	for k := range j {
		d.seen[k/64] |= 1 << (k % 64)
	}
}

// checkEndpoint compares rec with the endpoint sent as id; it returns what differs, or "".
func checkEndpoint(rec, buf []byte, want *plan.Endpoint, id uint32) string {
	if a := addrBytes(want.Address); [16]byte(rec[eAddr:eAddr+addrSize]) != a {
		return "address " + addrAt(rec, eAddr).String() + " is not the address of endpoint id " + itoa(uint64(id))
	}
	if p := u16(rec, ePort); p != want.Port {
		return "port " + itoa(uint64(p)) + " is not the port of endpoint id " + itoa(uint64(id))
	}
	if f := u16(rec, eFlags); f != endpointFlags(want) {
		return "flags " + itoa(uint64(f)) + " are not the flags of endpoint id " + itoa(uint64(id))
	}
	if !strFits(u32(rec, eNode), u32(rec, eNode+4), len(buf)) || !strFits(u32(rec, eZone), u32(rec, eZone+4), len(buf)) ||
		!strFits(u32(rec, ePod), u32(rec, ePod+4), len(buf)) {
		return "a string is outside the output"
	}
	return ""
}

// changed builds the service Weir uses from a validated, changed record.
func (d *decoder) changed(p, n int, s *plan.Service, aff uint32, sched byte) *plan.Service {
	c := s.Clone()
	c.Endpoints = c.Endpoints[:n]
	for j := range n {
		rec := d.buf[p+d.ep*j:]
		c.Endpoints[j] = s.Endpoints[u32(rec, eID)]
		c.Endpoints[j].Weight = u32(rec, eWeight)
	}
	if aff != affinitySeconds(s.Affinity) {
		c.Affinity = nil
		if aff != 0 {
			c.Affinity = &plan.Affinity{TimeoutSeconds: aff}
		}
	}
	if sched != schedulerCode(s.Scheduler) {
		c.Scheduler = plan.Schedulers[sched]
	}
	return c
}
