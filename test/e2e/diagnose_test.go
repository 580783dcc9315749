//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/core/diagnose"
	"github.com/weirproxy/weir/test/netns"
)

// diagnose runs weir diagnose with the kubernetes source as Weir's own
// ServiceAccount in the traffic cluster's node: from the running weir's
// debug endpoint, then computed from the API server (no daemon at the
// metrics address given), and for a Service that does not exist.
func (c *trafficCluster) diagnose(t *testing.T) {
	kubeconfig := weirKubeconfig(t, c.cp, trafficNode)
	base := []string{"diagnose", "-o", "json", "--source-kind", "kubernetes", "--kubeconfig", kubeconfig,
		"--node-name", trafficNode, "--cluster-cidrs", netns.DefaultPodCIDR.String(),
		"--healthz-bind-address", c.weir.serving(t, "healthzBindAddress")}
	daemon := append(slices.Clone(base), "--metrics-bind-address", c.weir.serving(t, "metricsBindAddress"))
	code, rep := diagnoseIn(t, c.topo.Node, append(daemon, "default/web")...)
	want := []string{"info sync.last", "info sync.committed", "info endpoints.counts", "info kernel.in-sync"}
	if code != 0 || rep.From != "daemon" || !containsAll(findingCodes(rep), want) {
		t.Errorf("diagnose default/web from the daemon: exit %d, from %q, %q; want exit 0 from the daemon with %q", code, rep.From, findingCodes(rep), want)
	}
	code, rep = diagnoseIn(t, c.topo.Node, append(slices.Clone(base), "--metrics-bind-address", "127.0.0.1:1", "default/web")...)
	want = []string{"info endpoints.counts", "info kernel.in-sync", "warning node.metrics-not-listening"}
	if code != 0 || rep.From != "source" || !containsAll(findingCodes(rep), want) {
		t.Errorf("diagnose default/web from the API server: exit %d, from %q, %q; want exit 0 from the source with %q", code, rep.From, findingCodes(rep), want)
	}
	code, rep = diagnoseIn(t, c.topo.Node, append(daemon, "default/nope")...)
	if code != 1 || !slices.Contains(findingCodes(rep), "broken service.not-found") {
		t.Errorf("diagnose default/nope: exit %d, %q; want exit 1 and service.not-found", code, findingCodes(rep))
	}
}

// diagnoseIn runs weir with args in node and returns its exit code and
// its JSON report.
func diagnoseIn(t *testing.T, node *netns.Namespace, args ...string) (int, diagnose.Report) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := node.Command(ctx, weirBinary(t), args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WEIR_") })
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	var rep diagnose.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("weir %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	t.Logf("weir %s: exit %d\n%s", strings.Join(args[len(args)-1:], " "), cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode(), rep
}

func findingCodes(rep diagnose.Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, f.Severity.String()+" "+f.Code)
	}
	return out
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
