package main

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/test/netns"
)

// webManifest is the demo's web Service with a selector, spec lines of
// the test's choosing (its type and ports), and its slice with the given
// endpoints; slicePorts is the slice's ports list.
func webManifest(spec string, endpoints []string, slicePorts string) string {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
` + spec + `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-demo, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: ` + slicePorts + `
endpoints:
`)
	for _, e := range endpoints {
		b.WriteString(e)
	}
	return b.String()
}

// The web Service's spec lines and slice ports the diagnose tests use.
const (
	clusterIPSpec = "  type: ClusterIP\n  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]\n"
	namedSpec     = "  type: ClusterIP\n  ports: [{name: http, protocol: TCP, port: 80, targetPort: web-http}]\n"
	localSpec     = "  type: NodePort\n  externalTrafficPolicy: Local\n" +
		"  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}]\n"
	httpPorts = "[{name: http, port: 8080, protocol: TCP}]"
)

// demoEndpoint is one endpoint of the web slice on node with conditions.
func demoEndpoint(addr, node, conditions string) string {
	return "  - {addresses: [" + addr + "], nodeName: " + node + ", conditions: {" + conditions + "}}\n"
}

const readyCond = "ready: true, serving: true, terminating: false"

// diagnoseRun runs weir diagnose -o json with args in ns and returns its
// exit code and report.
func diagnoseRun(t *testing.T, ns *netns.Namespace, weir string, args ...string) (int, diagnose.Report) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, weir, append([]string{"diagnose", "-o", "json"}, args...)...)
	cmd.Env = weirEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	var rep diagnose.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("weir diagnose %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	t.Logf("weir diagnose %s: exit %d\n%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode(), rep
}

// codes returns the report's findings as "severity code".
func codes(rep diagnose.Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, f.Severity.String()+" "+f.Code)
	}
	return out
}

// TestKernelDiagnose breaks the demo's web service in each way weir
// diagnose must explain, commits each state with sync --once (so the
// kernel matches the plan unless the test alters it), and checks that
// diagnose names the cause and exits 1; the healthy service exits 0.
func TestKernelDiagnose(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	ready := []string{demoEndpoint("10.244.0.11", demoNode, readyCond), demoEndpoint("10.244.0.12", demoNode, readyCond)}
	tests := []struct {
		name     string
		manifest string
		config   func(t *testing.T) string // a --config file, or none
		alter    func(t *testing.T)        // after the sync, before diagnose
		want     string                    // a "severity code" the report must hold
		code     int
	}{
		{name: "healthy", manifest: webManifest(clusterIPSpec, ready, httpPorts), want: "info kernel.in-sync", code: 0},
		{name: "no endpoints", manifest: webManifest(clusterIPSpec, nil, httpPorts), want: "broken endpoints.none", code: exitFailed},
		{name: "all terminating", manifest: webManifest(clusterIPSpec, []string{
			demoEndpoint("10.244.0.11", demoNode, "ready: false, serving: false, terminating: true"),
		}, httpPorts), want: "broken endpoints.none-serving", code: exitFailed},
		{name: "ETP Local without local endpoints", manifest: webManifest(localSpec,
			[]string{demoEndpoint("10.244.0.11", "other-node", readyCond)}, httpPorts),
			want: "broken policy.external-local-no-endpoints", code: exitFailed},
		{name: "named port unresolved", manifest: webManifest(namedSpec, ready, "[]"),
			want: "broken port.named-target-unresolved", code: exitFailed},
		{name: "plugin drops everything", manifest: webManifest(clusterIPSpec, ready, httpPorts), config: drainAllConfig,
			want: "broken plugins.dropped-all", code: exitFailed},
		{name: "table deleted by hand", manifest: webManifest(clusterIPSpec, ready, httpPorts),
			alter: func(t *testing.T) { nodeCommand(t, topo.Node, "nft", "delete", "table", "ip", "weir") },
			want:  "broken kernel.differs", code: exitFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyDemo(t)
			if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(tt.manifest), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"--source-path", dir, "--node-name", demoNode}
			if tt.config != nil {
				args = append(args, "--config", tt.config(t))
			}
			runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
			if tt.alter != nil {
				tt.alter(t)
			}
			code, rep := diagnoseRun(t, topo.Node, weir, append([]string{"default/web"}, args...)...)
			if code != tt.code || !slices.Contains(codes(rep), tt.want) {
				t.Errorf("exit %d with %q; want exit %d and %q", code, codes(rep), tt.code, tt.want)
			}
			// No weir run serves healthz and metrics here: the node warns
			// of that, the service itself must not.
			if tt.code == 0 && slices.ContainsFunc(rep.Findings, func(f diagnose.Finding) bool { return f.Severity > diagnose.Info && f.Subject != "node" }) {
				t.Errorf("a healthy service has warnings: %q", codes(rep))
			}
		})
	}
	t.Run("ip_forward off", func(t *testing.T) {
		dir := copyDemo(t)
		args := []string{"--source-path", dir, "--node-name", demoNode}
		runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
		nodeCommand(t, topo.Node, "sysctl", "-w", "net.ipv4.ip_forward=0")
		t.Cleanup(func() { nodeCommand(t, topo.Node, "sysctl", "-w", "net.ipv4.ip_forward=1") })
		for _, target := range []string{"node", "default/web"} {
			code, rep := diagnoseRun(t, topo.Node, weir, append([]string{target}, args...)...)
			if code != exitFailed || !slices.Contains(codes(rep), "broken node.ip-forward-off") {
				t.Errorf("diagnose %s: exit %d with %q; want exit %d and broken node.ip-forward-off", target, code, codes(rep), exitFailed)
			}
		}
	})
}

// drainAllConfig writes a configuration running the drain plugin on the
// demo's node without keeping the last endpoints: it drops them all.
func drainAllConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	yaml := "hooks:\n  cacheDir: " + filepath.Join(t.TempDir(), "cache") + "\nplugins:\n" +
		"  - name: drain\n    path: " + buildPlugin(t, "drain") + "\n    failurePolicy: open\n" +
		"    config: {nodes: [" + demoNode + "], keepLast: false}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// nodeCommand runs a command in ns and fails the test unless it succeeds.
func nodeCommand(t *testing.T, ns *netns.Namespace, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := ns.Command(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestKernelDiagnoseDaemon runs weir run and checks that weir diagnose
// reads the plan and the syncs from its debug endpoint: the last sync,
// when the service's rules were committed, the kernel in sync; then a
// change the daemon committed shows as its finding.
func TestKernelDiagnoseDaemon(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	dir := copyDemo(t)
	web := filepath.Join(dir, "web.yaml")
	ready := []string{demoEndpoint("10.244.0.11", demoNode, readyCond)}
	if err := os.WriteFile(web, []byte(webManifest(clusterIPSpec, ready, httpPorts)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--source-path", dir, "--node-name", demoNode,
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"}
	d := startDaemon(t, topo.Node, weir, append([]string{"run"}, args...)...)
	d.waitLog(t, `msg="Synced rules"`, 30*time.Second)

	code, rep := diagnoseRun(t, topo.Node, weir, append([]string{"default/web"}, args...)...)
	got := codes(rep)
	for _, want := range []string{"info sync.last", "info sync.committed", "info kernel.in-sync", "info endpoints.counts"} {
		if !slices.Contains(got, want) {
			t.Errorf("diagnose with weir run: no %q in %q", want, got)
		}
	}
	if code != 0 || rep.From != "daemon" || slices.ContainsFunc(rep.Findings, func(f diagnose.Finding) bool { return f.Severity > diagnose.Info }) {
		t.Errorf("diagnose with weir run: exit %d, from %q, %q; want exit 0 from the daemon with no warnings", code, rep.From, got)
	}

	notReady := []string{demoEndpoint("10.244.0.11", demoNode, "ready: false, serving: false, terminating: false")}
	if err := os.WriteFile(web, []byte(webManifest(clusterIPSpec, notReady, httpPorts)), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, rep = diagnoseRun(t, topo.Node, weir, append([]string{"default/web"}, args...)...)
		if slices.Contains(codes(rep), "broken endpoints.none-serving") || time.Now().After(deadline) {
			break
		}
		d.mustRun(t)
	}
	if code != exitFailed || rep.From != "daemon" || !slices.Contains(codes(rep), "info kernel.in-sync") {
		t.Errorf("after the endpoint stopped serving: exit %d, from %q, %q; want exit %d, endpoints.none-serving and the kernel in sync",
			code, rep.From, codes(rep), exitFailed)
	}

	// --all lists only the broken web service, not the healthy web-nodeport.
	code, rep = diagnoseRun(t, topo.Node, weir, append([]string{"--all"}, args...)...)
	subjects := map[string]bool{}
	for _, f := range rep.Findings {
		subjects[f.Subject] = true
	}
	if code != exitFailed || rep.From != "daemon" || !subjects["default/web:http/TCP"] || subjects["default/web-nodeport:http/TCP"] {
		t.Errorf("diagnose --all: exit %d, from %q, subjects %v; want exit %d from the daemon listing web and not web-nodeport",
			code, rep.From, subjects, exitFailed)
	}
}

// TestKernelDiagnoseIPTables checks diagnose in mode iptables, each
// flavour: in sync after sync --once, and naming the service whose rules
// a flushed KUBE-SERVICES no longer reaches.
func TestKernelDiagnoseIPTables(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	for _, flavour := range []string{"nft", "legacy"} {
		t.Run(flavour, func(t *testing.T) {
			topo := netns.NewThreePods(t)
			dir := copyDemo(t)
			args := []string{"--source-path", dir, "--node-name", demoNode, "--mode", "iptables", "--iptables-backend", flavour}
			runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
			code, rep := diagnoseRun(t, topo.Node, weir, append([]string{"default/web"}, args...)...)
			if code != 0 || rep.Mode != "iptables" || !slices.Contains(codes(rep), "info kernel.in-sync") {
				t.Errorf("after sync --once: exit %d, mode %q, %q; want exit 0 and the kernel in sync", code, rep.Mode, codes(rep))
			}
			nodeCommand(t, topo.Node, "iptables-"+flavour, "-t", "nat", "-F", "KUBE-SERVICES")
			code, rep = diagnoseRun(t, topo.Node, weir, append([]string{"default/web"}, args...)...)
			if code != exitFailed || !slices.Contains(codes(rep), "broken kernel.differs") {
				t.Errorf("after flushing KUBE-SERVICES: exit %d, %q; want exit %d and kernel.differs", code, codes(rep), exitFailed)
			}
		})
	}
}

// TestKernelDiagnoseTrace commits a load balancer whose source ranges
// exclude a client and traces connections through it: the excluded client
// is dropped by the source range (exit 1); an allowed one reaches the
// endpoint with its address kept under externalTrafficPolicy Local; a
// pod's connection to the cluster IP of the demo's web service names its
// endpoints and shares.
func TestKernelDiagnoseTrace(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	dir := copyDemo(t)
	lb := `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  loadBalancerSourceRanges: [203.0.113.0/24]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30081}]
status: {loadBalancer: {ingress: [{ip: 192.0.2.100}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: default, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
` + demoEndpoint("10.244.0.11", demoNode, readyCond)
	if err := os.WriteFile(filepath.Join(dir, "lb.yaml"), []byte(lb), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--source-path", dir, "--node-name", demoNode, "--cluster-cidrs", "10.244.0.0/16", "--service-cidrs", "10.96.0.0/16"}
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
	tests := []struct {
		from, to string
		code     int
		want     string // a code
		message  string // in that finding's message
	}{
		{"198.51.100.7", "192.0.2.100:80", exitFailed, "trace.dropped-source-range", "outside the load balancer's source ranges"},
		{"203.0.113.9", "192.0.2.100:80/tcp", 0, "trace.masquerade", "not masqueraded: the endpoint sees 203.0.113.9"},
		{"10.244.0.12", "10.96.0.10:80", 0, "trace.endpoints", "10.244.0.11:8080 (33.3%), 10.244.0.12:8080 (33.3%), 10.244.0.13:8080 (33.3%)"},
		{"10.244.0.12", "10.96.0.99:80", exitFailed, "trace.dropped-no-service", "no service has 10.96.0.99:80/TCP"},
	}
	for _, tt := range tests {
		code, rep := diagnoseRun(t, topo.Node, weir, append([]string{"trace", "--from", tt.from, "--to", tt.to}, args...)...)
		i := slices.IndexFunc(rep.Findings, func(f diagnose.Finding) bool { return f.Code == tt.want })
		if code != tt.code || i < 0 || !strings.Contains(rep.Findings[i].Message, tt.message) {
			t.Errorf("trace %s → %s: exit %d, %q; want exit %d and %s saying %q", tt.from, tt.to, code, codes(rep), tt.code, tt.want, tt.message)
		}
	}
}

// TestKernelDiagnoseStaleUDP leaves a UDP flow pointing at an endpoint
// that no longer serves (sync --once clears no conntrack entries, as a
// weir run that was down would not have): diagnose names the stale flow
// and exits 1.
func TestKernelDiagnoseStaleUDP(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	dir := copyDemo(t)
	dns := func(addr string) string {
		return `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 8080, protocol: UDP}]
endpoints:
` + demoEndpoint(addr, demoNode, readyCond)
	}
	path := filepath.Join(dir, "dns.yaml")
	if err := os.WriteFile(path, []byte(dns("10.244.0.11")), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--source-path", dir, "--node-name", demoNode}
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
	vip := netip.MustParseAddrPort("10.96.0.53:53")
	c, err := topo.Client.DialUDP(netip.AddrPortFrom(topo.ClientIP, 40153), vip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if a, err := c.Ask(ctx); err != nil || a.Pod != "pod-a" {
		t.Fatalf("UDP to %s: %v, %v; want pod-a", vip, a, err)
	}
	code, rep := diagnoseRun(t, topo.Node, weir, append([]string{"default/dns"}, args...)...)
	if code != 0 || !slices.Contains(codes(rep), "info conntrack.flows") {
		t.Errorf("with pod-a serving: exit %d, %q; want exit 0 and the flow counted", code, codes(rep))
	}

	if err := os.WriteFile(path, []byte(dns("10.244.0.12")), 0o644); err != nil {
		t.Fatal(err)
	}
	runWeir(t, topo.Node, weir, append([]string{"sync", "--once"}, args...)...)
	code, rep = diagnoseRun(t, topo.Node, weir, append([]string{"default/dns"}, args...)...)
	i := slices.IndexFunc(rep.Findings, func(f diagnose.Finding) bool { return f.Code == "conntrack.stale" })
	if code != exitFailed || i < 0 || !strings.Contains(rep.Findings[i].Message, "still goes to 10.244.0.11") {
		t.Errorf("after pod-a left: exit %d, %q; want exit %d and conntrack.stale naming 10.244.0.11", code, codes(rep), exitFailed)
	}
}

// TestKernelDiagnoseDaemonPlugins checks that weir diagnose names the
// plugin that changed a service when it reads weir run's debug endpoint,
// for one service and with --all (one request for every service).
func TestKernelDiagnoseDaemonPlugins(t *testing.T) {
	netns.RequireRoot(t)
	weir := buildWeir(t)
	topo := netns.NewThreePods(t)
	dir := copyDemo(t)
	ready := []string{demoEndpoint("10.244.0.11", demoNode, readyCond)}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest(clusterIPSpec, ready, httpPorts)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--source-path", dir, "--node-name", demoNode, "--config", drainAllConfig(t),
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"}
	d := startDaemon(t, topo.Node, weir, append([]string{"run"}, args...)...)
	d.waitLog(t, `msg="Synced rules"`, 30*time.Second)
	byDrain := func(f diagnose.Finding) bool {
		return f.Code == "plugins.changed" && f.Subject == "default/web:http/TCP" && strings.HasPrefix(f.Message, "plugin drain dropped")
	}
	for _, target := range []string{"default/web", "--all"} {
		code, rep := diagnoseRun(t, topo.Node, weir, append([]string{target}, args...)...)
		if code != exitFailed || rep.From != "daemon" || !slices.ContainsFunc(rep.Findings, byDrain) ||
			!slices.Contains(codes(rep), "broken plugins.dropped-all") {
			t.Errorf("diagnose %s: exit %d, from %q, %v; want exit %d from the daemon, plugins.dropped-all and drain's change named",
				target, code, rep.From, rep.Findings, exitFailed)
		}
	}
}
