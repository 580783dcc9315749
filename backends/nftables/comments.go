package nftables

import (
	"strings"

	"github.com/weirproxy/weir/sdk/plan"
)

// Every chain and element that stands for one service port's destination
// carries a comment naming the port, so that `nft list table ip weir |
// grep default/web` finds them: its sticky chains, its entries in the
// verdict maps (service-ips, service-nodeports, local-origin-*), its
// elements in the refuse and drop sets and in the firewall sets, and its
// buckets in the endpoints maps, so the grep lists its endpoints too.
// Options.PlainBuckets leaves the buckets, most of the table's elements,
// without: a full sync at 10k services is then about 8 % faster
// (docs/performance.md); a bucket's key starts with its entry's key, so
// grepping for the key an entry's line shows still finds its buckets.
// Objects that service ports share carry none: the pick chains
// and endpoints maps, and the hairpin and cluster-ips elements, whose
// reference counts (changes.go) do not say which port came first or
// which one still holds them. Comments are the nft tool's: user data
// holding a comment TLV (elemlist.go, encode.go). Only listings read
// them, and ReadBack, which tells the external elements of the refuse
// and drop sets by theirs.

// maxComment bounds a comment's bytes, as the nft tool bounds those it
// writes. The kernel refuses an element whose key, data and user data
// take more than 255 bytes (an IPv6 firewall-allow range's keys take 80);
// the longest key Kubernetes allows is 148 bytes.
const maxComment = 128

// portComment returns the comment of a service port's elements and
// chains: its key as plan.Key.String prints it, namespace/name:port/protocol,
// so that grepping `nft list table ip weir` for namespace/name finds them.
// A key longer than maxComment is cut, keeping its namespace and name
// first.
func portComment(k plan.Key) string { return cut(k.String(), maxComment) }

// nameComment sets the state's comment: old's, which names the same
// service port, or a new one. Only states that are written get one, so a
// sync that finds nothing changed makes none.
func (s *serviceState) nameComment(old *serviceState) {
	switch {
	case s == nil:
	case old != nil && old.comment != "":
		s.comment = old.comment
	default:
		s.comment = portComment(s.key)
	}
}

func cut(s string, n int) string { return s[:min(len(s), n)] }

// externalMark ends the comment of an external or load-balancer IP's
// element in the refuse and drop sets, whose keys look like cluster IPs'.
const externalMark = "external"

// externalComment returns the comment of an external or load-balancer
// IP's element in the refuse and drop sets: the service port's, then
// externalMark.
func externalComment(port string) string {
	return cut(port, maxComment-len(externalMark)-1) + " " + externalMark
}

// isExternal reports whether an element of the refuse and drop sets is an
// external or load-balancer IP's: its comment ends in a space and
// externalMark (no key holds a space), or is externalMark alone, as
// tables written before elements named their service port have it.
func isExternal(comment string) bool {
	return comment == externalMark || strings.HasSuffix(comment, " "+externalMark)
}
