package scale

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/weirproxy/weir/internal/golden"
)

// TestNarrowManifestsUnchanged pins the manifests of services of up to 16
// endpoints to what they were before wider ones were added
// (testdata/narrow.yaml was written by that generator): the benchmarks'
// figures, and the tests decoding them, stay comparable.
func TestNarrowManifestsUnchanged(t *testing.T) {
	var b strings.Builder
	for _, c := range [][3]int{{0, 1, 0}, {7, 3, 0}, {4242, 10, 0}, {4243, 10, 2}, {12345, 16, 3}, {99999, 10, 0}, {100000, 1, 70}, {9, 0, 0}} {
		b.Write(Manifest(c[0], c[1], c[2]))
		b.WriteString("=== end\n")
	}
	golden.Compare(t, "testdata/narrow.yaml", b.String())
}

var (
	sliceDoc    = regexp.MustCompile(`(?m)^kind: EndpointSlice$`)
	sliceName   = regexp.MustCompile(`(?m)^  name: (svc-\d+-\w+)$`)
	endpointRow = regexp.MustCompile(`(?m)^- addresses: \["([^"]+)"\]$`)
)

// TestEndpointsAreUniqueAndSliced checks clusters of each shape the
// benchmarks run: every service has its endpoints, in slices of at most
// SliceSize named apart, and no address serves twice or lies outside
// 10.128.0.0/9 (away from the cluster IPs, 10.96.0.0/11).
func TestEndpointsAreUniqueAndSliced(t *testing.T) {
	pods := netip.MustParsePrefix("10.128.0.0/9")
	for _, c := range []struct{ services, eps int }{{2000, 10}, {5000, 50}, {1, 5000}, {3, 250}} {
		t.Run(fmt.Sprintf("%dx%d", c.services, c.eps), func(t *testing.T) {
			if testing.Short() && c.services*c.eps > 100000 {
				t.Skip("a cluster of more than 100k endpoints takes seconds to check; not with -short")
			}
			seen := map[string]int{}
			for i := range c.services {
				m := string(Manifest(i, c.eps, 0))
				addrs := endpointRow.FindAllStringSubmatch(m, -1)
				if len(addrs) != c.eps {
					t.Fatalf("service %d has %d endpoints, want %d", i, len(addrs), c.eps)
				}
				slices := len(sliceDoc.FindAllString(m, -1))
				if want := max(1, (c.eps+SliceSize-1)/SliceSize); c.eps > narrow && slices != want {
					t.Fatalf("service %d has %d slices, want %d", i, slices, want)
				}
				names := map[string]bool{}
				for _, n := range sliceName.FindAllStringSubmatch(m, -1)[1:] {
					if names[n[1]] {
						t.Fatalf("service %d: two slices named %s", i, n[1])
					}
					names[n[1]] = true
				}
				for _, a := range addrs {
					addr, err := netip.ParseAddr(a[1])
					if err != nil || !pods.Contains(addr) {
						t.Fatalf("service %d: endpoint %q is not an address of %s", i, a[1], pods)
					}
					if prev, ok := seen[a[1]]; ok {
						t.Fatalf("services %d and %d share endpoint %s", prev, i, a[1])
					}
					seen[a[1]] = i
				}
			}
		})
	}
}
