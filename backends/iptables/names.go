package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	"github.com/weirproxy/weir/sdk/plan"
)

// The fixed chains, kube-proxy's names. nat holds kubeServices (dispatch on
// destination), kubeNodePorts (dispatch on node port), kubeMarkMasq and
// kubePostrouting (masquerading); filter holds kubeServices and
// kubeExternalServices (rejects and drops for traffic without endpoints),
// kubeProxyFirewall (loadBalancerSourceRanges), kubeForward and
// kubeNodePorts (health-check ports).
const (
	kubeServices         = "KUBE-SERVICES"
	kubeNodePorts        = "KUBE-NODEPORTS"
	kubeMarkMasq         = "KUBE-MARK-MASQ"
	kubePostrouting      = "KUBE-POSTROUTING"
	kubeExternalServices = "KUBE-EXTERNAL-SERVICES"
	kubeProxyFirewall    = "KUBE-PROXY-FIREWALL"
	kubeForward          = "KUBE-FORWARD"
)

// kubeProxyIPVSChains are, per table, the chains kube-proxy's IPVS mode
// adds to iptables that Weir's layout does not have; its other chains
// carry the names of Weir's fixed chains.
var kubeProxyIPVSChains = map[string][]string{
	tableNAT:    {"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},
	tableFilter: {"KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
}

// The prefixes of per-service chains, kube-proxy's: cluster-policy
// endpoints, local-policy endpoints, external traffic, load-balancer source
// ranges and one per endpoint. KUBE-XLB- is an older kube-proxy's name for
// KUBE-SVL-; such chains are deleted when found.
const (
	prefixSVC = "KUBE-SVC-"
	prefixSVL = "KUBE-SVL-"
	prefixEXT = "KUBE-EXT-"
	prefixFW  = "KUBE-FW-"
	prefixSEP = "KUBE-SEP-"
	prefixXLB = "KUBE-XLB-"
)

// serviceChainPrefixes are the prefixes of chains a full sync deletes when
// it finds them unused.
var serviceChainPrefixes = []string{prefixSVC, prefixSVL, prefixEXT, prefixFW, prefixSEP, prefixXLB}

// isServiceChain says whether a chain name is a per-service chain.
func isServiceChain(name string) bool {
	for _, p := range serviceChainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// servicePortName formats a key as kube-proxy's ServicePortName does:
// "namespace/name:port", or "namespace/name" without a port name. It is the
// comment on every rule of the service and, with the protocol, the input of
// its chain names.
func servicePortName(k plan.Key) string {
	if k.Port == "" {
		return k.Namespace + "/" + k.Name
	}
	return k.Namespace + "/" + k.Name + ":" + k.Port
}

// protoName returns the protocol as iptables spells it ("tcp").
func protoName(p plan.Protocol) string { return strings.ToLower(string(p)) }

// chainHash returns the first 16 characters of base32(sha256(s)), as
// kube-proxy names its chains; stable across restarts and identical to
// kube-proxy's names for the same service port and endpoint.
func chainHash(s string) string {
	return string(appendChainHash(nil, []byte(s)))
}

// appendChainHash appends the 16-character hash of input to b.
func appendChainHash(b, input []byte) []byte {
	sum := sha256.Sum256(input)
	var out [16]byte
	// 16 base32 characters encode exactly the first 10 bytes.
	base32.StdEncoding.Encode(out[:], sum[:10])
	return append(b, out[:]...)
}

// serviceChains names the chains of one service port.
type serviceChains struct {
	svc, svl, ext, fw string
}

// chainsFor returns the chain names of a service port: prefix +
// chainHash(portName + protocol), like kube-proxy's portProtoHash.
func chainsFor(portName, proto string) serviceChains {
	h := chainHash(portName + proto)
	return serviceChains{svc: prefixSVC + h, svl: prefixSVL + h, ext: prefixEXT + h, fw: prefixFW + h}
}

// endpointChain names the chain of one endpoint of a service port, like
// kube-proxy: KUBE-SEP- + chainHash(portName + protocol + "addr:port"),
// IPv6 addresses in brackets.
func endpointChain(portName, proto string, ep netip.AddrPort) string {
	var in [160]byte
	input := ep.AppendTo(append(append(in[:0], portName...), proto...))
	var out [32]byte
	return string(appendChainHash(append(out[:0], prefixSEP...), input))
}
