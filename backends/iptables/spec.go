package iptables

import (
	"net/netip"
	"strconv"
)

// spec builds the arguments of one rule (everything after "-A CHAIN"),
// each piece with a leading space, in the order kube-proxy writes them.
type spec []byte

// comment adds `-m comment --comment "text"`; the parts are concatenated.
func (s spec) comment(parts ...string) spec {
	s = append(s, ` -m comment --comment "`...)
	for _, p := range parts {
		s = append(s, p...)
	}
	return append(s, '"')
}

// arg adds literal arguments.
func (s spec) arg(args ...string) spec {
	for _, a := range args {
		s = append(s, ' ')
		s = append(s, a...)
	}
	return s
}

// proto adds "-m P -p P", which also enables --dport.
func (s spec) proto(p string) spec { return s.arg("-m", p, "-p", p) }

// dst adds "-d ADDR/BITS".
func (s spec) dst(a netip.Addr) spec {
	s = append(s, " -d "...)
	return appendHost(s, a)
}

// dstNet adds "-d PREFIX", negated when not is set.
func (s spec) dstNet(p netip.Prefix, not bool) spec {
	if not {
		s = append(s, " !"...)
	}
	s = append(s, " -d "...)
	return p.AppendTo(s)
}

// src adds "-s PREFIX", negated when not is set.
func (s spec) src(p netip.Prefix, not bool) spec {
	if not {
		s = append(s, " !"...)
	}
	s = append(s, " -s "...)
	return p.AppendTo(s)
}

// srcHost adds "-s ADDR/BITS".
func (s spec) srcHost(a netip.Addr) spec {
	s = append(s, " -s "...)
	return appendHost(s, a)
}

// dport adds "--dport N".
func (s spec) dport(n uint16) spec {
	s = append(s, " --dport "...)
	return strconv.AppendUint(s, uint64(n), 10)
}

// jump adds "-j TARGET".
func (s spec) jump(target string) spec { return s.arg("-j", target) }

// appendHost appends a as a host prefix ("10.0.0.1/32", "fd00::1/128"),
// the form iptables-save prints.
func appendHost(b []byte, a netip.Addr) []byte {
	b = a.AppendTo(b)
	b = append(b, '/')
	return strconv.AppendInt(b, int64(a.BitLen()), 10)
}

// commentTo adds the comment "portName -> addr:port" of an endpoint rule.
func (s spec) commentTo(portName string, ep netip.AddrPort) spec {
	s = append(s, ` -m comment --comment "`...)
	s = append(s, portName...)
	s = append(s, " -> "...)
	s = ep.AppendTo(s)
	return append(s, '"')
}
