package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/internal/xtables"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

func entryLines(es []setEntry) string {
	var lines []string
	for _, e := range es {
		lines = append(lines, e.String())
	}
	return strings.Join(lines, "\n")
}

func TestMasqEntries(t *testing.T) {
	etp := service("etp", plan.TCP, 80, 30081, []string{"10.96.0.11", "fd00:10:96::11"},
		localEP("10.244.0.11", 8080), ep("10.244.1.12", 8080, 1), localEP("fd00:10:244::11", 8080))
	etp.ExternalLocal = true
	etp.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	sctp := service("sctp", plan.SCTP, 9, 30009, []string{"10.96.0.12"}, ep("10.244.0.11", 9, 1))
	for _, tc := range []struct {
		svc  *plan.Service
		want string
	}{{etp, `WEIR-IPVS-CLUSTER-IP 10.96.0.11,TCP:80
WEIR-IPVS-CLUSTER-IP-6 fd00:10:96::11,TCP:80
WEIR-IPVS-EXTERNAL 172.30.0.1,TCP:30081
WEIR-IPVS-EXTERNAL 192.0.2.10,TCP:80
WEIR-IPVS-EXTERNAL-6 fd00::1,TCP:30081
WEIR-IPVS-EXTERNAL-LOCAL 172.30.0.1,TCP:30081
WEIR-IPVS-EXTERNAL-LOCAL 192.0.2.10,TCP:80
WEIR-IPVS-EXTERNAL-LOCAL-6 fd00::1,TCP:30081
WEIR-IPVS-HAIRPIN 10.244.0.11,TCP:8080,10.244.0.11
WEIR-IPVS-HAIRPIN 10.244.1.12,TCP:8080,10.244.1.12
WEIR-IPVS-HAIRPIN-6 fd00:10:244::11,TCP:8080,fd00:10:244::11`}, {sctp, `WEIR-IPVS-CLUSTER-IP 10.96.0.12,SCTP:9
WEIR-IPVS-EXTERNAL 172.30.0.1,SCTP:30009
WEIR-IPVS-HAIRPIN 10.244.0.11,SCTP:9,10.244.0.11`}} {
		st := desiredService(tc.svc, nodeIPs, "rr", 0)
		if got := entryLines(masqEntries(tc.svc, st, plan.Node{})); got != tc.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.svc.Key, got, tc.want)
		}
	}
	if got := masqEntries(nil, nil, plan.Node{}); got != nil {
		t.Errorf("deleted service: got %v", got)
	}
}

func TestSetNamesFit(t *testing.T) {
	for _, s := range allSets() {
		if len(s.name) > 31 || !strings.HasPrefix(s.name, "WEIR-") {
			t.Errorf("set %q: want a WEIR- name of at most 31 characters", s.name)
		}
	}
}

func TestRenderNAT(t *testing.T) {
	pod := netip.MustParsePrefix("10.244.0.0/16")
	pod6 := netip.MustParsePrefix("fd00:10:244::/64")
	node := plan.Node{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}}
	for _, tc := range []struct {
		name string
		o    backends.Common
		f    int
		node plan.Node
		want []string
	}{
		{"no detector", backends.Common{}, 4, plan.Node{}, nil},
		{"cluster CIDR", backends.Common{ClusterCIDRs: []netip.Prefix{pod, pod6}}, 4, plan.Node{},
			[]string{"-s 10.244.0.0/16 -j RETURN", "-g WEIR-IPVS-MARK-MASQ"}},
		{"cluster CIDR v6", backends.Common{ClusterCIDRs: []netip.Prefix{pod, pod6}}, 6, plan.Node{},
			[]string{"-s fd00:10:244::/64 -j RETURN", "-g WEIR-IPVS-MARK-MASQ"}},
		{"masquerade all", backends.Common{ClusterCIDRs: []netip.Prefix{pod}, MasqueradeAll: true}, 4, plan.Node{},
			[]string{"-g WEIR-IPVS-MARK-MASQ"}},
		{"node CIDR unknown", backends.Common{LocalDetector: backends.DetectNodeCIDR}, 4, plan.Node{},
			[]string{"-g WEIR-IPVS-MARK-MASQ"}},
		{"node CIDR", backends.Common{LocalDetector: backends.DetectNodeCIDR}, 4, node,
			[]string{"-s 10.244.3.0/24 -j RETURN", "-g WEIR-IPVS-MARK-MASQ"}},
		{"interface", backends.Common{LocalDetector: backends.DetectInterfaceNamePrefix, PodInterfacePrefix: "veth"}, 6, plan.Node{},
			[]string{"-i veth+ -j RETURN", "-g WEIR-IPVS-MARK-MASQ"}},
	} {
		text := string(renderRules(tc.f, &tc.o, tc.node, nil))
		var got []string
		for line := range strings.Lines(text) {
			if r, ok := strings.CutPrefix(strings.TrimSpace(line), "-A "+chainClusterIP+" "); ok {
				got = append(got, r)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: cluster-IP rules %q, want %q", tc.name, got, tc.want)
		}
	}
	text := string(renderRules(6, &backends.Common{}, plan.Node{}, nil))
	for _, want := range []string{":WEIR-IPVS-POSTROUTING - [0:0]\n",
		"-A WEIR-IPVS-SERVICES -m set --match-set WEIR-IPVS-CLUSTER-IP-6 dst,dst -g WEIR-IPVS-CLUSTER-IP\n",
		"-A WEIR-IPVS-SERVICES -m set --match-set WEIR-IPVS-EXTERNAL-LOCAL-6 dst,dst -j RETURN\n",
		"-A WEIR-IPVS-POSTROUTING -m set --match-set WEIR-IPVS-HAIRPIN-6 dst,dst,src -j MARK --set-xmark 0x4000/0x4000\n",
		"-A WEIR-IPVS-POSTROUTING -j MASQUERADE --random-fully\nCOMMIT\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("IPv6 nat text lacks %q:\n%s", want, text)
		}
	}
}

// fakeSets is an in-memory ipsetConn.
type fakeSets struct {
	sets map[string]map[string]netlink.IPSetEntry
	// heads are the sets' type, family and capacity, as listed.
	heads map[string]netlink.IPSetResult
	ops   []string
}

func newFakeSets() *fakeSets {
	return &fakeSets{sets: map[string]map[string]netlink.IPSetEntry{}, heads: map[string]netlink.IPSetResult{}}
}

func fakeKey(e *netlink.IPSetEntry) string {
	return fmt.Sprintf("%v/%d/%d/%v", e.IP, *e.Protocol, *e.Port, e.IP2)
}

func (f *fakeSets) IpsetCreate(name, kind string, o netlink.IpsetCreateOptions) error {
	if f.sets[name] != nil {
		return nl.IPSetError(nl.IPSET_ERR_EXIST_SETNAME2)
	}
	f.sets[name] = map[string]netlink.IPSetEntry{}
	f.heads[name] = netlink.IPSetResult{SetName: name, TypeName: kind, Family: o.Family, MaxElements: o.MaxElements}
	return nil
}

func (f *fakeSets) IpsetDestroy(name string) error {
	if f.sets[name] == nil {
		return unix.ENOENT
	}
	delete(f.sets, name)
	delete(f.heads, name)
	return nil
}

func (f *fakeSets) IpsetList(name string) (*netlink.IPSetResult, error) {
	s := f.sets[name]
	if s == nil {
		return nil, unix.ENOENT
	}
	res := f.heads[name]
	res.Entries = slices.Collect(maps.Values(s))
	return &res, nil
}

func (f *fakeSets) apply(name string, del bool, es []setEntry) error {
	for _, e := range es {
		n := toIpsetEntry(e)
		if del {
			f.ops = append(f.ops, "del "+name+" "+fakeKey(n))
			delete(f.sets[name], fakeKey(n))
			continue
		}
		f.ops = append(f.ops, "add "+name+" "+fakeKey(n))
		f.sets[name][fakeKey(n)] = *n
	}
	return nil
}

// toIpsetEntry returns the netlink form of e, as the kernel lists it.
func toIpsetEntry(e setEntry) *netlink.IPSetEntry {
	proto := uint8(protoNumber(e.proto))
	port := e.port
	out := &netlink.IPSetEntry{IP: e.addr.AsSlice(), Protocol: &proto, Port: &port, CIDR2: e.bits2}
	if e.addr2.IsValid() {
		out.IP2 = e.addr2.AsSlice()
	}
	return out
}

func (f *fakeSets) IpsetDel(name string, e *netlink.IPSetEntry) error {
	f.ops = append(f.ops, "del "+name+" "+fakeKey(e))
	delete(f.sets[name], fakeKey(e))
	return nil
}

func TestSetsFullAndPartial(t *testing.T) {
	f := newFakeSets()
	if err := ensureSets(f); err != nil {
		t.Fatal(err)
	}
	if err := ensureSets(f); err != nil {
		t.Fatalf("second ensureSets: %v", err)
	}
	a := setEntry{set: setClusterIP, addr: netip.MustParseAddr("10.96.0.10"), proto: plan.TCP, port: 80}
	b := setEntry{set: setExternal, addr: netip.MustParseAddr("172.30.0.1"), proto: plan.UDP, port: 30053}
	stray := setEntry{set: setHairpin, addr: netip.MustParseAddr("10.244.0.9"), proto: plan.TCP, port: 1, addr2: netip.MustParseAddr("10.244.0.9")}
	if err := f.apply(stray.set, false, []setEntry{stray}); err != nil {
		t.Fatal(err)
	}
	f.ops = nil
	refs := map[setEntry]int{a: 1, b: 2}
	reconcile := func() error {
		lists, wrong, err := listSets(f)
		if err != nil || len(wrong) > 0 {
			t.Fatalf("list: %v, wrong sets %v", err, wrong)
		}
		return reconcileSets(f, lists, refs)
	}
	if err := reconcile(); err != nil {
		t.Fatal(err)
	}
	if len(f.ops) != 3 || len(f.sets[setHairpin]) != 0 || len(f.sets[setClusterIP]) != 1 || len(f.sets[setExternal]) != 1 {
		t.Fatalf("full reconcile: ops %q, sets %v", f.ops, f.sets)
	}
	f.ops = nil
	if err := reconcile(); err != nil || len(f.ops) != 0 {
		t.Fatalf("second reconcile: ops %q, err %v", f.ops, err)
	}
	// b is shared by two services: dropping one keeps it.
	if err := updateSets(f, refs, []setEntry{b}, nil); err != nil || len(f.ops) != 0 || refs[b] != 1 {
		t.Fatalf("drop one of two references: ops %q, refs %v, err %v", f.ops, refs, err)
	}
	if err := updateSets(f, refs, []setEntry{a, b}, []setEntry{a}); err != nil || len(f.sets[setExternal]) != 0 || refs[a] != 1 {
		t.Fatalf("drop the last reference: ops %q, refs %v, err %v", f.ops, refs, err)
	}
	if destroyed, err := destroySets(f); err != nil || len(f.sets) != 0 || len(destroyed) != len(allSets()) {
		t.Fatalf("destroy: %v, destroyed %v, left %v", err, destroyed, slices.Collect(maps.Keys(f.sets)))
	}
	if destroyed, err := destroySets(f); err != nil || len(destroyed) != 0 {
		t.Fatalf("destroy again: %v, destroyed %v", err, destroyed)
	}
}

func TestListSetsFindsSetsOfTheWrongKind(t *testing.T) {
	f := newFakeSets()
	if err := ensureSets(f); err != nil {
		t.Fatal(err)
	}
	small := f.heads[setHairpin]
	small.MaxElements = 65536
	f.heads[setHairpin] = small
	f.heads[setDrop+setSuffix6] = netlink.IPSetResult{TypeName: "hash:ip,port", Family: unix.AF_INET, MaxElements: setCapacity}
	f.heads[setClusterIP] = netlink.IPSetResult{TypeName: "hash:ip", Family: unix.AF_INET, MaxElements: setCapacity}
	lists, wrong, err := listSets(f)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range wrong {
		got = append(got, s.name+": "+s.mismatch(lists[s.name]))
	}
	want := []string{
		"WEIR-IPVS-CLUSTER-IP: type hash:ip, want hash:ip,port",
		"WEIR-IPVS-HAIRPIN: capacity 65536, want 1048576",
		"WEIR-IPVS-DROP-6: family 2, want 10 (IPv6)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("wrong sets:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := replaceSets(f, wrong); err != nil {
		t.Fatal(err)
	}
	if _, wrong, _ := listSets(f); len(wrong) != 0 {
		t.Errorf("after replaceSets still wrong: %v", wrong)
	}
}

func TestFromIpsetEntryRoundTrip(t *testing.T) {
	for _, e := range []setEntry{
		{set: setHairpin + setSuffix6, addr: netip.MustParseAddr("fd00::5"), proto: plan.SCTP, port: 9, addr2: netip.MustParseAddr("fd00::5")},
		{set: setExternalLocal, addr: netip.MustParseAddr("172.30.0.1"), proto: plan.TCP, port: 30080},
		{set: setSourceRanges, addr: netip.MustParseAddr("198.51.100.5"), proto: plan.TCP, port: 443, addr2: netip.MustParseAddr("10.244.0.0"), bits2: 24},
	} {
		var spec setSpec
		for _, s := range allSets() {
			if s.name == e.set {
				spec = s
			}
		}
		if got, ok := fromIpsetEntry(spec, toIpsetEntry(e)); !ok || got != e {
			t.Errorf("%s: read back %s (%v)", e, got, ok)
		}
	}
}

func TestChooseFlavour(t *testing.T) {
	if _, err := chooseFlavour(t.Context(), 0, "bogus"); err == nil || !strings.Contains(err.Error(), "Options.Flavour") {
		t.Errorf("bogus flavour: %v", err)
	}
	if fl, err := chooseFlavour(t.Context(), 0, FlavourLegacy); fl != FlavourLegacy || err != nil {
		t.Errorf("legacy: %q, %v", fl, err)
	}
}

func TestFlavourTools(t *testing.T) {
	for _, fl := range []string{FlavourNFT, FlavourLegacy} {
		if xtables.FindBin("iptables-"+fl+"-restore") == "" {
			t.Logf("no iptables-%s here", fl)
			continue
		}
		tools, err := flavourTools(fl)
		if err != nil {
			t.Fatal(err)
		}
		if len(tools) != 2 || !strings.HasSuffix(tools[1].restore, "/ip6tables-"+fl+"-restore") || tools[1].family != 6 {
			t.Errorf("%s: tools %+v", fl, tools)
		}
	}
	if _, err := flavourTools("bogus"); err == nil || !strings.Contains(err.Error(), "ip6tables-bogus-restore") {
		t.Errorf("missing flavour: %v", err)
	}
}
