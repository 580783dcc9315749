//go:build vm

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/test/netns"
)

// The IPVS end-to-end test needs a kernel with IPVS, which the host lacks:
// it builds only with the vm tag and runs inside the VM of `make test-vm`.
// The VM has no Go toolchain, so the test binary doubles as weir: started
// with runAsWeir set, it runs the command instead of the tests.
const runAsWeir = "GO_TEST_RUN_AS_WEIR" // not WEIR_*: config rejects unknown WEIR_* variables

func TestMain(m *testing.M) {
	if os.Getenv(runAsWeir) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// ipvsManifests is the demo's web service, written out here because the
// VM holds only the test binary.
const ipvsManifests = `apiVersion: v1
kind: Node
metadata:
  name: ` + demoNode + `
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [10.244.0.11], conditions: {ready: true}, nodeName: ` + demoNode + `, targetRef: {kind: Pod, namespace: default, name: pod-a}}
  - {addresses: [10.244.0.12], conditions: {ready: true}, nodeName: ` + demoNode + `, targetRef: {kind: Pod, namespace: default, name: pod-b}}
  - {addresses: [10.244.0.13], conditions: {ready: true}, nodeName: ` + demoNode + `, targetRef: {kind: Pod, namespace: default, name: pod-c}}
`

// TestVMIPVS runs `weir sync --once` in mode ipvs, with a non-default
// scheduler, interface and iptables flavour, in a node namespace: a client
// outside the node reaches every pod through the cluster IP, the virtual
// server has the scheduler and the masquerade chains the flavour. Then
// `weir cleanup`, in the default mode, removes all of it.
func TestVMIPVS(t *testing.T) {
	dir, topo := ipvsNode(t)
	const ifName = "weir-test0"
	out := weirInVM(t, topo.Node, "sync", "--once", "--source-path", dir, "--node-name", demoNode,
		"--mode", "ipvs", "--ipvs-scheduler", "wrr", "--ipvs-interface", ifName, "--iptables-backend", "legacy")
	if want := `msg="Using IPVS" scheduler=wrr interface=` + ifName + ` iptablesBackend=legacy`; !strings.Contains(out, want) {
		t.Errorf("weir sync did not log %s", want)
	}
	netns.WantPods(t, "after weir sync --once", netns.DialMany(t, topo.Client, webVIP, 30), "pod-a", "pod-b", "pod-c")

	// The kernel's view, from inside the node.
	var table []byte
	var hasLink bool
	var chains []byte
	err := topo.Node.Do(func() error {
		var err error
		// /proc/net follows the process's namespace; thread-self, this thread's.
		if table, err = os.ReadFile("/proc/thread-self/net/ip_vs"); err != nil {
			return err
		}
		_, lerr := net.InterfaceByName(ifName)
		hasLink = lerr == nil
		chains, err = exec.Command("/usr/sbin/iptables-legacy", "-t", "nat", "-S").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables-legacy -t nat -S: %w: %s", err, chains)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// 10.96.0.10:80 as /proc/net/ip_vs prints it.
	if want := "TCP  0A60000A:0050 wrr"; !strings.Contains(string(table), want) {
		t.Errorf("/proc/net/ip_vs has no %q:\n%s", want, table)
	}
	if !hasLink {
		t.Errorf("no interface %s after sync", ifName)
	}
	if !strings.Contains(string(chains), "-N WEIR-IPVS-") {
		t.Errorf("iptables-legacy has no WEIR-IPVS-* chains:\n%s", chains)
	}

	// cleanup in the default mode (nftables) removes mode ipvs's state too;
	// it needs the interface's name to find it.
	out = weirInVM(t, topo.Node, "cleanup", "--node-name", demoNode, "--ipvs-interface", ifName)
	if want := `msg="Removed Weir's rules" mode=ipvs flavour=""`; !strings.Contains(out, want) {
		t.Errorf("weir cleanup did not log %s", want)
	}
	if a, err := dialOnce(topo.Client, webVIP); err == nil {
		t.Errorf("after weir cleanup the ClusterIP still answers: %s", a)
	}
	err = topo.Node.Do(func() error {
		var err error
		if table, err = os.ReadFile("/proc/thread-self/net/ip_vs"); err != nil {
			return err
		}
		_, lerr := net.InterfaceByName(ifName)
		hasLink = lerr == nil
		chains, err = exec.Command("/usr/sbin/iptables-legacy", "-t", "nat", "-S").CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(table), "0A60000A:0050") {
		t.Errorf("after weir cleanup /proc/net/ip_vs still has the service:\n%s", table)
	}
	if hasLink {
		t.Errorf("after weir cleanup interface %s still exists", ifName)
	}
	if strings.Contains(string(chains), "WEIR-IPVS-") {
		t.Errorf("after weir cleanup iptables-legacy still has WEIR-IPVS-* rules:\n%s", chains)
	}
}

// ipvsNode checks that the VM has IPVS, writes the web service's
// manifests into a folder and returns it with a node of three pods.
func ipvsNode(t *testing.T) (string, *netns.Topology) {
	t.Helper()
	netns.RequireRoot(t)
	if !ipvsInKernel() {
		t.Fatalf("no %s: the VM must load ip_vs", procIPVS)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(ipvsManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, netns.NewThreePods(t)
}

// weirInVM runs this test binary as weir inside ns, fails the test unless
// it exits 0, and returns its output. The process is started from a thread
// inside ns, so all of it runs there (no `ip netns exec`).
func weirInVM(t *testing.T, ns *netns.Namespace, args ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []byte
	err = ns.Do(func() error {
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Env = append(weirEnv(), runAsWeir+"=1")
		var rerr error
		out, rerr = cmd.CombinedOutput()
		return rerr
	})
	t.Logf("weir %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("weir %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// TestVMIPVSHandBack hands a node Weir served in mode ipvs back to
// kube-proxy's IPVS mode, whose interface kube-ipvs0 holds the cluster IP
// as kube-proxy's first sync leaves it. `weir cleanup --keep-kube-proxy`
// removes Weir's interface, WEIR-IPVS-* chains and ipsets, and keeps the
// virtual server, which kube-proxy's IPVS mode shares with Weir (same
// address and port) and takes over: the cluster IP still answers from
// every pod.
func TestVMIPVSHandBack(t *testing.T) {
	dir, topo := ipvsNode(t)
	const ifName = "weir-test0"
	weirInVM(t, topo.Node, "sync", "--once", "--source-path", dir, "--node-name", demoNode,
		"--mode", "ipvs", "--ipvs-interface", ifName, "--iptables-backend", "legacy")
	if err := topo.Node.Do(addKubeIPVS0); err != nil {
		t.Fatalf("kube-ipvs0: %v", err)
	}

	out := weirInVM(t, topo.Node, "cleanup", "--keep-kube-proxy", "--mode", "ipvs", "--node-name", demoNode, "--ipvs-interface", ifName)
	for _, want := range []string{`what="IPVS interface" removed=` + ifName, `what="IPVS ipsets" removed="WEIR-IPVS-`, "iptables-legacy nat WEIR-IPVS-SERVICES"} {
		if !strings.Contains(out, want) {
			t.Errorf("weir cleanup --keep-kube-proxy did not log %s", want)
		}
	}
	var table, chains []byte
	var links []string
	err := topo.Node.Do(func() error {
		var err error
		if table, err = os.ReadFile("/proc/thread-self/net/ip_vs"); err != nil {
			return err
		}
		for _, name := range []string{ifName, "kube-ipvs0"} {
			if _, err := net.InterfaceByName(name); err == nil {
				links = append(links, name)
			}
		}
		chains, err = exec.Command("/usr/sbin/iptables-legacy", "-t", "nat", "-S").CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(table), "TCP  0A60000A:0050") {
		t.Errorf("the hand-back removed the virtual server kube-proxy shares:\n%s", table)
	}
	if strings.Join(links, " ") != "kube-ipvs0" {
		t.Errorf("interfaces after the hand-back: %v, want kube-ipvs0 only", links)
	}
	if strings.Contains(string(chains), "WEIR-IPVS-") {
		t.Errorf("after the hand-back iptables-legacy still has WEIR-IPVS-* rules:\n%s", chains)
	}
	netns.WantPods(t, "after the hand-back", netns.DialMany(t, topo.Client, webVIP, 30), "pod-a", "pod-b", "pod-c")
}

// addKubeIPVS0 adds kube-proxy's IPVS interface, a dummy holding the
// demo's cluster IP, in the caller's namespace.
func addKubeIPVS0() error {
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}}); err != nil {
		return err
	}
	l, err := netlink.LinkByName("kube-ipvs0")
	if err != nil {
		return err
	}
	return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: webVIP.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}})
}

// TestVMIPVSDiagnose runs weir diagnose in mode ipvs: in sync after sync
// --once, then the virtual server deleted by hand is a kernel difference
// that names the service, and diagnose exits 1.
func TestVMIPVSDiagnose(t *testing.T) {
	dir, topo := ipvsNode(t)
	args := []string{"--source-path", dir, "--node-name", demoNode, "--mode", "ipvs"}
	weirInVM(t, topo.Node, append([]string{"sync", "--once"}, args...)...)
	code, rep := diagnoseInVM(t, topo.Node, append([]string{"default/web"}, args...)...)
	if code != 0 || rep.Mode != "ipvs" || !slices.Contains(codes(rep), "info kernel.in-sync") {
		t.Errorf("after sync --once: exit %d, mode %q, %q; want exit 0 and the kernel in sync", code, rep.Mode, codes(rep))
	}
	err := topo.Node.Do(func() error {
		h, err := ipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		services, err := h.GetServices()
		if err != nil {
			return err
		}
		for _, s := range services {
			if s.Address.Equal(net.ParseIP("10.96.0.10")) {
				return h.DelService(s)
			}
		}
		return fmt.Errorf("no virtual server 10.96.0.10 among %d", len(services))
	})
	if err != nil {
		t.Fatalf("delete the virtual server by hand: %v", err)
	}
	code, rep = diagnoseInVM(t, topo.Node, append([]string{"default/web"}, args...)...)
	if code != exitFailed || !slices.Contains(codes(rep), "broken kernel.differs") {
		t.Errorf("after the virtual server was deleted: exit %d, %q; want exit %d and kernel.differs", code, codes(rep), exitFailed)
	}
}

// diagnoseInVM runs this test binary as weir diagnose -o json inside ns
// and returns its exit code and report.
func diagnoseInVM(t *testing.T, ns *netns.Namespace, args ...string) (int, diagnose.Report) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []byte
	var code int
	err = ns.Do(func() error {
		cmd := exec.CommandContext(ctx, self, append([]string{"diagnose", "-o", "json"}, args...)...)
		cmd.Env = append(weirEnv(), runAsWeir+"=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		var rerr error
		out, rerr = cmd.Output()
		code = cmd.ProcessState.ExitCode()
		if ee := new(exec.ExitError); rerr != nil && !errors.As(rerr, &ee) {
			return fmt.Errorf("%w: %s", rerr, stderr.String())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("weir diagnose %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("weir diagnose %s: exit %d\n%s", strings.Join(args, " "), code, out)
	var rep diagnose.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("weir diagnose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return code, rep
}
