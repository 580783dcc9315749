package nftables

import "net/netip"

// draw is what a goto element sends its key's packets to: a chain of kind
// that draws an endpoint of pool.
type draw struct {
	kind pickKind
	key  elemKey
	pool pool
}

// mapID is the endpoints map a draw's buckets are in.
func (d *draw) mapID() mapID { return mapID{lane: d.kind.lane(), weight: d.pool.weight()} }

// externalKinds returns the kinds of the state's external IPs and node
// port.
func (s *serviceState) externalKinds() (ip, nodePort pickKind) {
	if s.externalLocal {
		return pickExternalLocal, pickNodePortLocal
	}
	return pickExternal, pickNodePort
}

// draws returns the draws of the state's goto elements, in entry order:
// its cluster IPs, external IPs, their short circuit and its node port's
// (shortcircuit.go), then its node port. An address whose pool is empty
// has no draw: its entry goes to the drop or refuse sets (unserved).
func (s *serviceState) draws() []draw {
	if s == nil {
		return nil
	}
	var out []draw
	add := func(kind pickKind, key elemKey, p pool) {
		if p.weight() > 0 {
			out = append(out, draw{kind: kind, key: key, pool: p})
		}
	}
	ext, extPort := s.externalKinds()
	for _, ip := range s.ips {
		add(pickCluster, ipElemKey(ip, s.proto, s.port), s.internal)
	}
	for _, ip := range s.extIPs {
		add(ext, ipElemKey(ip, s.proto, s.port), s.external)
	}
	if s.externalLocal {
		for _, ip := range s.extIPs {
			add(pickShortIP, ipElemKey(ip, s.proto, s.port), s.cluster)
		}
		if s.nodePort != 0 {
			add(pickShortNP, portElemKey(s.proto, s.nodePort), s.cluster)
		}
	}
	if s.nodePort != 0 {
		add(extPort, portElemKey(s.proto, s.nodePort), s.external)
	}
	return out
}

// bucketDraws returns those of the draws whose buckets are in endpoints
// maps: none with ClientIP affinity, whose chains hold their endpoints in
// rules.
func (s *serviceState) bucketDraws(draws []draw) []draw {
	if s == nil || s.affinity > 0 {
		return nil
	}
	return draws
}

// pickSpec returns the shared pick chain a draw goes through; false for a
// sticky service's own chains.
func (s *serviceState) pickSpec(d *draw) (pickSpec, bool) {
	if s.affinity > 0 {
		return pickSpec{}, false
	}
	return pickSpec{kind: d.kind, weight: d.pool.weight()}, true
}

// writeEntries writes into c's lists (to delete with del set, else to add)
// the elements that send the state's addresses somewhere: the goto
// elements of its draws; for an address whose pool is empty, an element of
// the drop sets when the service has endpoints elsewhere, of the refuse
// sets when it has none; and those of its load-balancer source ranges.
func (s *serviceState) writeEntries(c *changes, draws []draw, del bool) {
	for i := range draws {
		d := &draws[i]
		e := element{key: d.key.bytes(), verdict: c.chainFor(s, d), comment: s.comment}
		c.list(d.kind.lane().vmap(), del).add(&e)
	}
	ips, ports := setNoEPIPs, setNoEPNodePorts
	if s.hasEndpoints {
		ips, ports = setDropIPs, setDropNodePorts
	}
	if s.internal.weight() == 0 {
		for _, ip := range s.ips {
			c.key(ips, del, ipElemKey(ip, s.proto, s.port), s.comment)
		}
	}
	if s.external.weight() == 0 {
		for _, ip := range s.extIPs {
			// The comment's last word tells them from cluster IPs for ReadBack.
			c.key(ips, del, ipElemKey(ip, s.proto, s.port), externalComment(s.comment))
		}
		if s.nodePort != 0 {
			c.key(ports, del, portElemKey(s.proto, s.nodePort), s.comment)
		}
	}
	for _, ip := range s.lbIPs {
		c.key(setFirewallIPs, del, ipElemKey(ip, s.proto, s.port), s.comment)
		for _, r := range s.ranges {
			e := allowElement(ip, s.proto, s.port, r)
			e.comment = s.comment
			c.list(setFirewallAllow, del).add(&e)
		}
	}
}

// key writes an element holding key k alone.
func (c *changes) key(set string, del bool, k elemKey, comment string) {
	e := element{key: k.bytes(), comment: comment}
	c.list(set, del).add(&e)
}

// writeBuckets writes the elements of d's buckets for which keep is true
// into its endpoints map's list, each with the comment given.
func (c *changes) writeBuckets(d *draw, del bool, comment string, keep func(i int) bool) {
	l := c.mapList(d.mapID(), del)
	for i, ep := range d.pool.buckets {
		if keep(i) {
			l.bucket(&d.key, uint32(i), ep, comment)
		}
	}
}

// bucket adds the element of one bucket: "key . bucket" to the endpoint.
// Its comment is empty unless buckets are commented (comments.go).
func (l *elemList) bucket(key *elemKey, bucket uint32, ep netip.AddrPort, comment string) {
	var k [28]byte
	var v [20]byte
	e := element{key: appendBucket(append(k[:0], key.bytes()...), bucket), val: appendEndpoint(v[:0], ep), comment: comment}
	l.add(&e)
}

func everyBucket(int) bool { return true }
