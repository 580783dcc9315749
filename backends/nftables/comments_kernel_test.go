package nftables

import (
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// TestKernelCommentsNameServicePorts commits two service ports and reads
// what `nft list table ip weir` prints: grepping it for one port's key
// finds the comments of that port's chains and entries, each in the
// chain or set the layout puts them in and naming one of the port's own
// addresses or ports, and nothing of the other port; grepping for the
// key an entry's line shows finds its buckets. Partial syncs keep the
// comments: one replacing an endpoint leaves the entries alone, one
// removing an endpoint rewrites them (the total weight changes), and the
// new entries carry the comment.
func TestKernelCommentsNameServicePorts(t *testing.T) {
	topo := netns.NewT(t, netns.Options{})
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd()}, PlainBuckets: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// web has ClientIP affinity, so chains of its own, and a
	// load-balancer IP with a source range; api draws from buckets.
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 30080, ep("10.244.0.11", 8080, 1))
	web.Affinity = &plan.Affinity{TimeoutSeconds: 60}
	web.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	api := svc("default", "api", "grpc", plan.TCP, "10.96.0.20", 9000, 30090, ep("10.244.0.21", 8080, 1), ep("10.244.0.22", 8080, 1))
	p := testPlan(web, api)
	mustSync(t, b, p, backends.FullSync())

	webWant := map[string]int{setServiceIPs: 2, setNodePorts: 1, setFirewallIPs: 1, setFirewallAllow: 1,
		"sticky-ip-default/web/http/tcp": 1, "sticky-ext-default/web/http/tcp": 1, "sticky-np-default/web/http/tcp": 1}
	apiWant := map[string]int{setServiceIPs: 1, setNodePorts: 1}
	// A node port's protocol prints as tcp, or as 6 where nft finds no
	// /etc/protocols (the test VM).
	webOwn := []string{"10.96.0.10 ", "192.0.2.10 ", " . 30080 ", "default/web/http/tcp"}
	apiOwn := []string{"10.96.0.20 ", " . 30090 "}
	listing := nftOutput(t, b, "list", "table", "ip", "weir")
	wantCommented(t, "after the full sync", listing, web, webWant, webOwn...)
	wantCommented(t, "after the full sync", listing, api, apiWant, apiOwn...)
	for _, line := range grep(listing, "default/web") {
		if strings.Contains(line, "default/api") {
			t.Errorf("grep default/web finds a line of default/api: %s", line)
		}
	}
	wantBuckets(t, listing, api, "endpoints-2", 2)

	replaced := api.Clone()
	replaced.Endpoints[1] = ep("10.244.0.23", 8080, 1)
	p.Services[api.Key] = replaced
	mustSync(t, b, p, backends.PartialSync(api.Key))
	listing = nftOutput(t, b, "list", "table", "ip", "weir")
	wantCommented(t, "after replacing an endpoint", listing, api, apiWant, apiOwn...)
	wantBuckets(t, listing, api, "endpoints-2", 2)

	scaled := api.Clone()
	scaled.Endpoints = scaled.Endpoints[:1]
	p.Services[api.Key] = scaled
	mustSync(t, b, p, backends.PartialSync(api.Key))
	listing = nftOutput(t, b, "list", "table", "ip", "weir")
	wantCommented(t, "after removing an endpoint", listing, api, apiWant, apiOwn...)
	for _, c := range commentedLines(listing, comment(api)) {
		if !weightOne.MatchString(c.line) {
			t.Errorf("after removing an endpoint: %s: %s does not go to a pick chain of weight 1", c.in, c.line)
		}
	}
	wantBuckets(t, listing, api, "endpoints-1", 1)
	wantNoDivergence(t, "read back", b, p)
}

// weightOne matches an entry going to a pick chain of weight 1.
var weightOne = regexp.MustCompile(`goto pick-(ip|np)-1\b`)

// wantBuckets checks the second step of finding a service port's
// elements: the key its service-ips entry shows, grepped for, finds n
// buckets in endpoints map m.
func wantBuckets(t *testing.T, listing string, s *plan.Service, m string, n int) {
	t.Helper()
	var key string
	for _, c := range commentedLines(listing, comment(s)) {
		if c.in == setServiceIPs {
			key, _, _ = strings.Cut(strings.TrimPrefix(c.line, "elements = { "), " "+comment(s))
		}
	}
	got := 0
	for _, c := range commentedLines(listing, key+" . ") {
		if c.in == m {
			got++
		}
	}
	if key == "" || got != n {
		t.Errorf("%s's cluster IP entry shows key %q, which finds %d buckets in %s, want %d:\n%s", s.Key, key, got, m, n, listing)
	}
}

// comment is how nft prints the comment of a service port's objects.
func comment(s *plan.Service) string { return `comment "` + s.Key.String() + `"` }

// wantCommented checks where a listing holds s's comment: in each chain
// or set of want as many times as it says, nowhere else, and each time on
// a line that names one of s's own (its addresses, node port or chain
// names).
func wantCommented(t *testing.T, when, listing string, s *plan.Service, want map[string]int, own ...string) {
	t.Helper()
	got := map[string]int{}
	for _, c := range commentedLines(listing, comment(s)) {
		got[c.in]++
		if !slices.ContainsFunc(own, func(o string) bool { return strings.Contains(c.in+" "+c.line, o) }) {
			t.Errorf("%s: %s carries the comment of %s but names none of its addresses: %s", when, c.in, s.Key, c.line)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s: the comment of %s is in %v, want %v; listing:\n%s", when, s.Key, got, want, listing)
	}
}

// commented is a line of a listing and the chain or set it is in.
type commented struct{ in, line string }

// commentedLines returns the lines of a listing that hold text, each with
// the chain, set or map it is in.
func commentedLines(listing, text string) []commented {
	var out []commented
	in := ""
	for line := range strings.Lines(listing) {
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[2] == "{" && slices.Contains([]string{"chain", "set", "map"}, fields[0]) {
			in = fields[1]
		}
		if strings.Contains(line, text) {
			out = append(out, commented{in: in, line: strings.TrimSpace(line)})
		}
	}
	return out
}

// grep returns the lines of text that hold s.
func grep(text, s string) []string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// TestKernelCommentsOnBuckets checks that by default every bucket of a
// service port carries its comment too, through partial syncs that
// replace an endpoint and change the weight, and grepping the listing for
// the service finds its endpoints.
func TestKernelCommentsOnBuckets(t *testing.T) {
	topo := netns.NewT(t, netns.Options{})
	b, err := New(Options{Common: backends.Common{NetNS: topo.Node.Fd()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	web := svc("default", "web", "http", plan.TCP, "10.96.0.10", 80, 30080, ep("10.244.0.11", 8080, 1))
	api := svc("default", "api", "grpc", plan.TCP, "10.96.0.20", 9000, 30090, ep("10.244.0.21", 8080, 1), ep("10.244.0.22", 8080, 1))
	p := testPlan(web, api)
	mustSync(t, b, p, backends.FullSync())
	// Each entry (cluster IP and node port) has its own buckets, in
	// endpoints-N and nodeport-endpoints-N.
	wantCommentedBuckets(t, "after the full sync", b, api, "endpoints-2", 4, "10.244.0.21", "10.244.0.22")
	wantCommentedBuckets(t, "after the full sync", b, web, "endpoints-1", 2, "10.244.0.11")

	replaced := api.Clone()
	replaced.Endpoints[1] = ep("10.244.0.23", 8080, 1)
	p.Services[api.Key] = replaced
	mustSync(t, b, p, backends.PartialSync(api.Key))
	wantCommentedBuckets(t, "after replacing an endpoint", b, api, "endpoints-2", 4, "10.244.0.21", "10.244.0.23")

	scaled := replaced.Clone()
	scaled.Endpoints = scaled.Endpoints[:1]
	p.Services[api.Key] = scaled
	mustSync(t, b, p, backends.PartialSync(api.Key))
	wantCommentedBuckets(t, "after removing an endpoint", b, api, "endpoints-1", 2, "10.244.0.21")
	wantCommentedBuckets(t, "after removing an endpoint", b, web, "endpoints-1", 2, "10.244.0.11")
	wantNoDivergence(t, "read back", b, p)
}

// wantCommentedBuckets checks that the listing's endpoints map m and its
// node-port twin hold n buckets with s's comment, each going to one of the endpoints given, and
// that every one of those endpoints has at least one.
func wantCommentedBuckets(t *testing.T, when string, b *Backend, s *plan.Service, m string, n int, endpoints ...string) {
	t.Helper()
	listing := nftOutput(t, b, "list", "table", "ip", "weir")
	seen := map[string]bool{}
	got := 0
	for _, c := range commentedLines(listing, comment(s)) {
		if c.in != m && c.in != "nodeport-"+m {
			continue
		}
		got++
		i := slices.IndexFunc(endpoints, func(e string) bool { return strings.Contains(c.line, ": "+e+" ") })
		if i < 0 {
			t.Errorf("%s: a bucket of %s goes to none of %v: %s", when, s.Key, endpoints, c.line)
			continue
		}
		seen[endpoints[i]] = true
	}
	if got != n || len(seen) != len(endpoints) {
		t.Errorf("%s: %d buckets of %s in %s carry its comment, reaching %v; want %d reaching %v; listing:\n%s",
			when, got, s.Key, m, seen, n, endpoints, listing)
	}
}
