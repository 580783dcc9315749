//go:build vm

package ipvs

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/internal/syncbuf"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/netns"
)

// weirLayerStandIn stands in for Weir's masquerade layer in the flavour
// the backend does not use (left by an earlier run with the other
// flavour): its chain, jumped to from PREROUTING by Weir's own rule.
const weirLayerStandIn = `*nat
:WEIR-IPVS-SERVICES - [0:0]
-A PREROUTING -m comment --comment "weir IPVS service masquerading" -j WEIR-IPVS-SERVICES
COMMIT
`

// TestKernelHandBack hands a node back to kube-proxy's IPVS mode in the
// VM. Weir serves web (cluster IP, node port 30080) and local, whose
// external policy Local gives it a short circuit (a firewall-mark virtual
// server), with its masquerade layer in iptables-legacy and a stand-in of
// it in iptables-nft; kube-proxy's interface kube-ipvs0 holds the cluster
// IP, as kube-proxy's first sync leaves it, and kube-proxy has an ipset.
// HandBack removes the layer's chains in both flavours and families,
// Weir's ipsets, the firewall-mark virtual servers and Weir's interface,
// and logs each; the virtual servers on addresses and ports stay, and so
// do kube-proxy's interface and set. The cluster IP still answers. A
// second HandBack finds nothing to remove.
func TestKernelHandBack(t *testing.T) {
	logs := &syncbuf.Buffer{}
	opts := Options{Flavour: FlavourLegacy}
	opts.Log = slog.New(slog.NewTextHandler(logs, nil))
	topo, b := newCluster(t, opts)
	web := service("web", plan.TCP, 80, 30080, []string{vip.String()}, podEP(podA, 1))
	local := service("local", plan.TCP, 80, 30081, []string{"10.96.0.21"}, localEP(podB.String(), podPort))
	local.ExternalLocal = true
	mustSync(t, b, testPlan(web, local), backends.FullSync())
	for _, tool := range []string{"iptables-nft-restore", "ip6tables-nft-restore"} {
		runIn(t, topo, weirLayerStandIn, "/usr/sbin/"+tool, "--noflush")
	}
	addKubeIPVS0(t, b, vip)
	createSet(t, b, "KUBE-CLUSTER-IP")
	want := kernelServers(t, b)
	marked := 0
	for k := range want {
		if strings.HasPrefix(k, "FWM ") {
			delete(want, k)
			marked++
		}
	}
	if marked == 0 {
		t.Fatalf("no firewall-mark virtual server before the hand-back: %v", want)
	}

	if err := b.HandBack(context.Background()); err != nil {
		t.Fatalf("HandBack: %v", err)
	}
	if got := kernelServers(t, b); !maps.Equal(got, want) {
		t.Errorf("after HandBack the virtual servers are\n%v\nwant those on addresses and ports:\n%v", got, want)
	}
	wantHandedBack(t, topo, b)
	for _, line := range []string{
		`what="IPVS masquerade chains" removed="iptables-legacy nat WEIR-IPVS-SERVICES,`,
		`ip6tables-legacy mangle WEIR-IPVS-NODE-FIREWALL, iptables-nft nat WEIR-IPVS-SERVICES, ip6tables-nft nat WEIR-IPVS-SERVICES"`,
		`what="IPVS ipsets" removed="WEIR-IPVS-CLUSTER-IP,`,
		`what="IPVS firewall-mark virtual servers" removed="FWM 65536 IPv4"`,
		`what="IPVS interface" removed=` + DefaultInterface,
	} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("HandBack did not log %s; log:\n%s", line, logs)
		}
	}
	netns.WantPods(t, "the cluster IP after HandBack", netns.DialMany(t, topo.Client, netip.AddrPortFrom(vip, 80), 5), "pod-a")

	if err := b.HandBack(context.Background()); err != nil {
		t.Errorf("a second HandBack: %v", err)
	}
	if n := strings.Count(logs.String(), "Removed Weir's own rules"); n != 4 {
		t.Errorf("a second HandBack removed something; log:\n%s", logs)
	}
}

// wantHandedBack checks what HandBack left: no chain of the layer in
// either flavour, no set of Weir's, kube-proxy's set and interface, and
// no interface of Weir's.
func wantHandedBack(t *testing.T, topo *netns.Topology, b *Backend) {
	t.Helper()
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"} {
		if out := runIn(t, topo, "", "/usr/sbin/"+save); strings.Contains(out, "WEIR-IPVS") {
			t.Errorf("after HandBack %s still has the layer's chains:\n%s", save, out)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range allSets() {
		if _, err := b.sets.IpsetList(s.name); err == nil {
			t.Errorf("after HandBack ipset %s is still there", s.name)
		}
	}
	if _, err := b.sets.IpsetList("KUBE-CLUSTER-IP"); err != nil {
		t.Errorf("after HandBack kube-proxy's ipset is gone: %v", err)
	}
	if _, err := b.nl.LinkByName(kubeProxyInterface); err != nil {
		t.Errorf("after HandBack kube-proxy's interface is gone: %v", err)
	}
	if _, err := b.nl.LinkByName(DefaultInterface); !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Errorf("after HandBack: interface %s: %v, want it gone", DefaultInterface, err)
	}
}

// TestKernelHandBackLeavesOthersInterfaces checks that HandBack deletes
// Options.Interface only when it is Weir's: not when it is named as
// kube-proxy's kube-ipvs0, and not when it is no dummy interface.
func TestKernelHandBackLeavesOthersInterfaces(t *testing.T) {
	topo := netns.NewT(t, netns.Options{})
	logs := &syncbuf.Buffer{}
	for _, tc := range []struct {
		iface, peer, warning string
	}{
		{kubeProxyInterface, "", "ipvs.interface is kube-proxy's interface name"},
		{"weir-veth0", "weir-veth1", "it is no dummy interface"},
	} {
		opts := Options{Interface: tc.iface}
		opts.NetNS, opts.Log = topo.Node.Fd(), slog.New(slog.NewTextHandler(logs, nil))
		b, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		var link netlink.Link = &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: tc.iface}}
		if tc.peer != "" {
			link = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tc.iface}, PeerName: tc.peer}
		}
		if err := b.nl.LinkAdd(link); err != nil {
			t.Fatalf("add %s: %v", tc.iface, err)
		}
		if err := b.HandBack(context.Background()); err != nil {
			t.Errorf("HandBack with interface %s: %v", tc.iface, err)
		}
		if _, err := b.nl.LinkByName(tc.iface); err != nil || !strings.Contains(logs.String(), tc.warning) {
			t.Errorf("HandBack deleted %s (%v) or did not say why not; log:\n%s", tc.iface, err, logs)
		}
	}
}

// runIn runs a host program in the node with stdin (none when empty) and
// returns its output.
func runIn(t *testing.T, topo *netns.Topology, stdin, name string, args ...string) string {
	t.Helper()
	var out []byte
	err := topo.Node.Do(func() (err error) {
		cmd := exec.Command(name, args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
