package iptables

import (
	"net/netip"
	"strconv"
)

// tableID says which table a rule goes to.
type tableID uint8

// The tables a service writes to.
const (
	natTable tableID = iota
	filterTable
)

// sharedRule is one rule a service adds to a fixed chain (KUBE-SERVICES,
// KUBE-NODEPORTS, ...). Partial syncs add and delete such rules one by one.
type sharedRule struct {
	table tableID
	// insert makes partial syncs insert the rule at the head of its chain
	// rather than append it: KUBE-SERVICES must end with the node-port jump,
	// and firewall exceptions must precede their service's drop.
	insert bool
	chain  string
	// spec is the rule after "-A CHAIN ".
	spec string
}

// chainSpan locates one chain's rules in serviceText.text.
type chainSpan struct {
	name       string
	start, end int
}

// serviceText is everything one service port renders to in one family.
type serviceText struct {
	// text holds the "-A CHAIN ..." lines of the service's own chains.
	text   []byte
	chains []chainSpan
	rules  []sharedRule
}

// service renders one service port into r.out, which render emptied.
func (r *renderer) service(m *svcModel) {
	rt := m.route()
	r.dispatch(m, rt)
	r.filterRules(m, rt)
	clusterSEPs, localSEPs := r.sepNames(m, m.cluster, rt.useSVC), r.sepNames(m, m.local, rt.useSVL)
	if rt.useSVC {
		r.balanceChain(m, rt.names.svc, m.cluster, clusterSEPs, rt.internal == rt.names.svc)
	}
	if rt.useSVL {
		r.balanceChain(m, rt.names.svl, m.local, localSEPs, rt.internal == rt.names.svl)
	}
	if rt.useEXT {
		r.extChain(m, rt)
	}
	if rt.useFW {
		r.fwChain(m, rt)
	}
	// An endpoint of both pools gets one chain.
	var done []member
	if rt.useSVC {
		done = m.cluster
	}
	r.endpointChains(m, m.cluster, clusterSEPs, nil)
	r.endpointChains(m, m.local, localSEPs, done)
}

// sepNames returns the endpoint chain names of a pool in use.
func (r *renderer) sepNames(m *svcModel, pool []member, used bool) []string {
	if !used {
		return nil
	}
	names := make([]string, len(pool))
	for i, mb := range pool {
		names[i] = endpointChain(m.portName, m.proto, mb.ep)
	}
	return names
}

// spec returns the scratch spec, emptied.
func (r *renderer) spec() spec { return r.scratch[:0] }

// rule appends "-A chain spec" to the service's chain text.
func (r *renderer) rule(chain string, s spec) {
	r.out.text = append(r.out.text, "-A "...)
	r.out.text = append(r.out.text, chain...)
	r.out.text = append(r.out.text, s...)
	r.out.text = append(r.out.text, '\n')
	r.scratch = s[:0]
}

// beginChain starts the rules of one of the service's chains.
func (r *renderer) beginChain(name string) {
	r.out.chains = append(r.out.chains, chainSpan{name: name, start: len(r.out.text)})
}

// endChain ends the chain begun last.
func (r *renderer) endChain() {
	r.out.chains[len(r.out.chains)-1].end = len(r.out.text)
}

// shared records a rule of a fixed chain.
func (r *renderer) shared(t tableID, chain string, insert bool, s spec) {
	r.out.rules = append(r.out.rules, sharedRule{table: t, insert: insert, chain: chain, spec: string(s[1:])})
	r.scratch = s[:0]
}

// dispatch writes the nat rules that send the service's addresses to its
// chains: cluster IPs, external and load-balancer IPs in KUBE-SERVICES,
// the node port in KUBE-NODEPORTS.
func (r *renderer) dispatch(m *svcModel, rt routing) {
	if rt.internal != "" {
		for _, ip := range m.clusterIPs {
			r.shared(natTable, kubeServices, true,
				r.spec().comment(m.portName, " cluster IP").proto(m.proto).dst(ip).dport(m.port).jump(rt.internal))
		}
	}
	if !rt.useEXT {
		return
	}
	for _, e := range m.extIPs {
		target, kind := rt.names.ext, " external IP"
		if e.ranged {
			target = rt.names.fw
		}
		if e.lb || e.ranged {
			kind = " loadbalancer IP"
		}
		r.shared(natTable, kubeServices, true,
			r.spec().comment(m.portName, kind).proto(m.proto).dst(e.ip).dport(m.port).jump(target))
	}
	if m.nodePort != 0 {
		r.shared(natTable, kubeNodePorts, false, r.spec().comment(m.portName).proto(m.proto).dport(m.nodePort).jump(rt.names.ext))
	}
}

// filterRules writes the filter rules of the service: reject (no endpoints
// at all) or drop (none for this traffic policy) for addresses whose
// traffic has no endpoint, the load-balancer firewall, and the health-check
// port.
func (r *renderer) filterRules(m *svcModel, rt routing) {
	if rt.internal == "" {
		why, verdict := r.noEndpoints(m, m.internalLocal)
		for _, ip := range m.clusterIPs {
			r.shared(filterTable, kubeServices, false,
				r.spec().comment(m.portName, why).proto(m.proto).dst(ip).dport(m.port).arg(verdict...))
		}
	}
	if len(rt.externalPool) == 0 {
		why, verdict := r.noEndpoints(m, m.externalLocal)
		for _, e := range m.extIPs {
			r.shared(filterTable, kubeExternalServices, false,
				r.spec().comment(m.portName, why).proto(m.proto).dst(e.ip).dport(m.port).arg(verdict...))
		}
		if m.nodePort != 0 {
			r.shared(filterTable, kubeExternalServices, false,
				r.spec().comment(m.portName, why).arg("-m", "addrtype", "--dst-type", "LOCAL").proto(m.proto).dport(m.nodePort).arg(verdict...))
		}
	}
	for _, e := range m.extIPs {
		// Without endpoints at all, as in kube-proxy, no firewall: every
		// source is rejected above, those in the ranges too.
		if e.ranged && m.hasEndpoints {
			r.firewall(m, rt, e.ip)
		}
	}
	if m.hcPort != 0 {
		r.shared(filterTable, kubeNodePorts, false,
			r.spec().comment(m.portName, " health check node port").proto("tcp").dport(m.hcPort).jump("ACCEPT"))
	}
}

// noEndpoints returns the comment and verdict for traffic of one policy
// that has no endpoint: rejected when the service has no endpoints at all,
// dropped when it has some but none for this traffic (elsewhere, with the
// Local policy; drained or not serving, with the Cluster policy).
func (r *renderer) noEndpoints(m *svcModel, local bool) (string, []string) {
	switch {
	case !m.hasEndpoints:
		return " has no endpoints", r.reject(m.proto)
	case local:
		return " has no local endpoints", []string{"-j", "DROP"}
	}
	return " has no usable endpoints", []string{"-j", "DROP"}
}

// reject returns the verdict for traffic to a service without endpoints:
// a TCP reset for TCP (as the nftables backend: refused at once even while
// connect() is still running), ICMP port unreachable otherwise.
func (r *renderer) reject(proto string) []string {
	switch {
	case proto == "tcp":
		return []string{"-j", "REJECT", "--reject-with", "tcp-reset"}
	case r.f == ipv6:
		return []string{"-j", "REJECT", "--reject-with", "icmp6-port-unreachable"}
	}
	return []string{"-j", "REJECT", "--reject-with", "icmp-port-unreachable"}
}

// firewall drops new connections to a load-balancer IP that its source
// ranges do not allow, the node's own too (KUBE-PROXY-FIREWALL is jumped
// to from OUTPUT). When the IP has a nat chain, allowed traffic has been
// translated before the filter table sees it, so one drop rule catches the
// rest (as kube-proxy). Otherwise (endpoints, none for external traffic)
// allowed sources return first, to be dropped like any traffic without
// endpoints for it.
func (r *renderer) firewall(m *svcModel, rt routing, ip netip.Addr) {
	by := "loadBalancerSourceRanges"
	if rt.useFW {
		by = rt.names.fw
	} else {
		for _, rg := range m.ranges {
			r.shared(filterTable, kubeProxyFirewall, true, r.spec().comment(m.portName, " loadbalancer IP").
				src(rg, false).proto(m.proto).dst(ip).dport(m.port).jump("RETURN"))
		}
	}
	r.shared(filterTable, kubeProxyFirewall, false,
		r.spec().comment(m.portName, " traffic not accepted by ", by).proto(m.proto).dst(ip).dport(m.port).jump("DROP"))
}

// balanceChain writes KUBE-SVC (pool of the Cluster policy) or KUBE-SVL
// (Local policy): for the chain cluster IPs go to, the masquerade rules
// first, then affinity and the weighted choice of an endpoint.
func (r *renderer) balanceChain(m *svcModel, chain string, pool []member, seps []string, internal bool) {
	r.beginChain(chain)
	if internal {
		r.clusterMasquerade(m, chain)
	}
	if m.affinity > 0 {
		secs := strconv.FormatUint(uint64(m.affinity), 10)
		for i, mb := range pool {
			r.rule(chain, r.endpointComment(m, mb.ep).
				arg("-m", "recent", "--name", seps[i], "--rcheck", "--seconds", secs, "--reap").jump(seps[i]))
		}
	}
	weights := make([]uint64, len(pool))
	for i, mb := range pool {
		weights[i] = mb.weight
	}
	probs := probabilities(weights)
	for i, mb := range pool {
		s := r.endpointComment(m, mb.ep)
		if i < len(probs) {
			s = append(s.arg("-m", "statistic", "--mode", "random", "--probability"), ' ')
			s = appendProbability(s, probs[i])
		}
		r.rule(chain, s.jump(seps[i]))
	}
	r.endChain()
}

// clusterMasquerade marks cluster-IP traffic for masquerading as the local
// traffic detector says: everything (masqueradeAll, or NodeCIDR before the
// node's podCIDRs are known), what does not come from pods, or nothing.
func (r *renderer) clusterMasquerade(m *svcModel, chain string) {
	for _, ip := range m.clusterIPs {
		base := func() spec { return r.spec().comment(m.portName, " cluster IP").proto(m.proto).dst(ip).dport(m.port) }
		switch r.det.masq {
		case masqNone:
			// Without a detector, cluster-IP traffic keeps its source.
		case masqAll:
			r.rule(chain, base().jump(kubeMarkMasq))
		case masqNotPod:
			r.rule(chain, base().arg(r.det.notPod).jump(kubeMarkMasq))
		case masqUnmarkPods:
			// iptables cannot negate several ranges in one rule: mark, then
			// unmark what comes from a pod range.
			r.rule(chain, base().jump(kubeMarkMasq))
			for _, pm := range r.det.podMatch {
				r.rule(chain, base().arg(pm, "-j", "MARK", "--and-mark", unmarkMasq))
			}
		}
	}
}

// extChain writes KUBE-EXT: external traffic (node port, external and
// load-balancer IPs). Cluster policy: masquerade, then KUBE-SVC. Local
// policy: the node's own and its pods' traffic goes to the cluster's
// endpoints (the node's masqueraded), the rest to KUBE-SVL, keeping the
// client's address.
func (r *renderer) extChain(m *svcModel, rt routing) {
	ext := rt.names.ext
	r.beginChain(ext)
	defer r.endChain()
	if !m.externalLocal {
		r.rule(ext, r.spec().comment("masquerade traffic for ", m.portName, " external destinations").jump(kubeMarkMasq))
		r.rule(ext, r.spec().jump(rt.names.svc))
		return
	}
	if rt.shortCircuit {
		r.rule(ext, r.spec().comment("masquerade LOCAL traffic for ", m.portName, " external destinations").
			arg("-m", "addrtype", "--src-type", "LOCAL").jump(kubeMarkMasq))
		r.rule(ext, r.spec().comment("route LOCAL traffic for ", m.portName, " external destinations").
			arg("-m", "addrtype", "--src-type", "LOCAL").jump(rt.names.svc))
		for _, pm := range r.det.podMatch {
			if r.o.MasqueradeAll {
				r.rule(ext, r.spec().comment("pod traffic for ", m.portName, " external destinations").arg(pm).jump(kubeMarkMasq))
			}
			r.rule(ext, r.spec().comment("pod traffic for ", m.portName, " external destinations").arg(pm).jump(rt.names.svc))
		}
	} else if r.localhostNodePorts && m.nodePort != 0 {
		// A reply cannot go back to 127.0.0.1 from a pod: masquerade localhost.
		r.rule(ext, r.spec().comment("masquerade localhost traffic for ", m.portName, " node port").
			src(r.f.loopback(), false).jump(kubeMarkMasq))
	}
	if len(m.local) > 0 {
		r.rule(ext, r.spec().jump(rt.names.svl))
	}
}

// fwChain writes KUBE-FW: load-balancer traffic from allowed sources goes
// on to KUBE-EXT; KUBE-PROXY-FIREWALL drops the rest in filter, the node's
// own included, as kube-proxy. The allowed sources hold the load-balancer
// IPs themselves when a range holds the node's IP (svcModel.ranges).
func (r *renderer) fwChain(m *svcModel, rt routing) {
	fw := rt.names.fw
	r.beginChain(fw)
	for _, rg := range m.ranges {
		r.rule(fw, r.spec().comment(m.portName, " loadbalancer IP").src(rg, false).jump(rt.names.ext))
	}
	r.rule(fw, r.spec().comment("other traffic to ", m.portName, " will be dropped by KUBE-PROXY-FIREWALL"))
	r.endChain()
}

// endpointChains writes one KUBE-SEP chain per endpoint of a pool in use
// (seps non-nil), skipping endpoints already written with the pool skip:
// masquerade hairpin traffic (an endpoint reaching itself), record the
// client for affinity, DNAT.
func (r *renderer) endpointChains(m *svcModel, pool []member, seps []string, skip []member) {
	for i, mb := range pool {
		if seps == nil || containsEndpoint(skip, mb.ep) {
			continue
		}
		sep := seps[i]
		r.beginChain(sep)
		r.rule(sep, r.sepComment(m).srcHost(mb.ep.Addr()).jump(kubeMarkMasq))
		s := r.sepComment(m)
		if m.affinity > 0 {
			s = s.arg("-m", "recent", "--name", sep, "--set")
		}
		s = append(s.proto(m.proto).arg("-j", "DNAT", "--to-destination"), ' ')
		r.rule(sep, mb.ep.AppendTo(s))
		r.endChain()
	}
}

// endpointComment starts a rule of a KUBE-SVC or KUBE-SVL chain that
// picks endpoint ep: with the comment "portName -> ep", unless the
// renderer is quiet.
func (r *renderer) endpointComment(m *svcModel, ep netip.AddrPort) spec {
	if r.quiet {
		return r.spec()
	}
	return r.spec().commentTo(m.portName, ep)
}

// sepComment starts a rule of a KUBE-SEP chain: with the service's name
// as comment, unless the renderer is quiet.
func (r *renderer) sepComment(m *svcModel) spec {
	if r.quiet {
		return r.spec()
	}
	return r.spec().comment(m.portName)
}

// containsEndpoint says whether pool holds ep.
func containsEndpoint(pool []member, ep netip.AddrPort) bool {
	for _, mb := range pool {
		if mb.ep == ep {
			return true
		}
	}
	return false
}
