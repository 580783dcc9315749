// Command demo shows Weir proxying real traffic with no cluster: it builds a
// node, a client and three pods out of network namespaces, runs `weir run` on
// example manifests, and prints how requests to a ClusterIP spread over the
// pods before and after an endpoint is removed. It needs root and removes
// everything it created when it ends.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/test/netns"
)

const (
	nodeName = "weir-demo-node"
	removed  = "pod-b"
)

var (
	clusterIP = netip.MustParseAddrPort("10.96.0.10:80")
	pods      = netns.ThreePods() // the pods the example manifests name
)

func main() {
	weir := flag.String("weir", "bin/weir", "the weir binary")
	manifests := flag.String("manifests", "examples/demo", "folder of example manifests")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: run as root (it creates network namespaces): sudo make demo")
		os.Exit(2)
	}
	if err := run(*weir, *manifests); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(weir, manifests string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	weir, err := filepath.Abs(weir)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "weir-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := copyManifests(manifests, dir); err != nil {
		return err
	}
	topo, err := netns.New(netns.Options{Pods: pods})
	if err != nil {
		return fmt.Errorf("build namespaces: %w", err)
	}
	defer func() {
		topo.Close()
		fmt.Println("\nCleaned up: weir stopped, its rules and the namespaces removed.")
	}()
	fmt.Printf("Weir demo: node, client and three pods (pod-a, pod-b, pod-c) in network namespaces weir-%s-*\n", topo.ID)

	logPath := filepath.Join(os.TempDir(), "weir-demo-"+topo.ID+".log")
	daemon, err := startWeir(ctx, topo, weir, dir, logPath)
	if err != nil {
		return err
	}
	defer daemon.stop(topo, weir)
	fmt.Printf("weir run is serving %s inside the node (log: %s)\n", manifests, logPath)
	if err := waitFor(ctx, 15*time.Second, func() bool { return answers(ctx, topo, 1) != nil }); err != nil {
		return fmt.Errorf("the ClusterIP never answered; see %s", logPath)
	}
	return steps(ctx, topo, dir, logPath)
}

func steps(ctx context.Context, topo *netns.Topology, dir, logPath string) error {
	fmt.Printf("\n1. 100 requests from the client namespace to ClusterIP %s (service default/web):\n", clusterIP)
	show(netns.Tally(answers(ctx, topo, 100)))

	start := time.Now()
	if err := removeEndpoint(filepath.Join(dir, "web.yaml"), removed); err != nil {
		return err
	}
	err := waitFor(ctx, 10*time.Second, func() bool {
		return netns.Tally(answers(ctx, topo, 20))[removed] == 0
	})
	if err != nil {
		return fmt.Errorf("%s still receives traffic 10s after its removal", removed)
	}
	fmt.Printf("\n2. %s removed from EndpointSlice default/web-demo; traffic stopped reaching it within %s.\n",
		removed, time.Since(start).Round(time.Millisecond))
	if line := lastLogLine(logPath, "Updating endpoints"); line != "" {
		fmt.Println("   weir logged:", line)
	}
	fmt.Println("   100 more requests:")
	show(netns.Tally(answers(ctx, topo, 100)))

	nodePort := netip.AddrPortFrom(topo.NodeIP, 30080)
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if a, err := topo.Client.DialTCP(c, nodePort); err == nil {
		fmt.Printf("\n3. NodePort %s (service default/web-nodeport) was answered by %s, which saw the node's\n"+
			"   address %s as the source: NodePort traffic is masqueraded.\n", nodePort, a.Pod, a.Source.Addr())
	} else {
		return fmt.Errorf("NodePort %s: %w", nodePort, err)
	}
	fmt.Println("   The headless and ExternalName services in the folder got no rules, as with kube-proxy.")
	return nil
}

// answers sends n requests to the ClusterIP from the client namespace and
// returns the answers; nil if any request failed.
func answers(ctx context.Context, topo *netns.Topology, n int) []netns.Answer {
	var out []netns.Answer
	for range n {
		c, cancel := context.WithTimeout(ctx, time.Second)
		a, err := topo.Client.DialTCP(c, clusterIP)
		cancel()
		if err != nil {
			return nil
		}
		out = append(out, a)
	}
	return out
}

func show(tally map[string]int) {
	for _, p := range pods {
		n := tally[p.Name]
		fmt.Printf("   %-6s %-50s %3d\n", p.Name, strings.Repeat("█", n/2), n)
	}
}

func waitFor(ctx context.Context, limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

type daemon struct {
	cmd  *exec.Cmd
	done chan error
}

func startWeir(ctx context.Context, topo *netns.Topology, weir, dir, logPath string) (*daemon, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := topo.Node.Command(context.Background(), weir, "run", "--source-path", dir, "--node-name", nodeName,
		"--min-sync-period", "0s", "--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start weir: %w", err)
	}
	d := &daemon{cmd: cmd, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait(); logFile.Close() }()
	return d, nil
}

// stop ends weir run (which leaves its rules) and removes the rules.
func (d *daemon) stop(topo *netns.Topology, weir string) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM) // it fails only when weir has exited already
	select {
	case _ = <-d.done: // how weir exited was logged to its log file
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		_ = <-d.done
	}
	if out, err := topo.Node.Command(context.Background(), weir, "cleanup").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: weir cleanup: %v\n%s", err, out)
	}
}

// lastLogLine returns the last line of the log that contains phrase.
func lastLogLine(path, phrase string) string {
	b, _ := os.ReadFile(path)
	var found string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, phrase) {
			found = line
		}
	}
	return found
}

func copyManifests(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// removeEndpoint rewrites the EndpointSlice in path without the endpoint of
// the named pod, atomically, as a controller or kubectl edit would.
func removeEndpoint(path, pod string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	docs := bytes.Split(b, []byte("\n---\n"))
	for i, doc := range docs {
		if !bytes.Contains(doc, []byte("kind: EndpointSlice")) {
			continue
		}
		var slice discoveryv1.EndpointSlice
		if err := yaml.UnmarshalStrict(doc, &slice); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		slice.Endpoints = slices.DeleteFunc(slice.Endpoints, func(e discoveryv1.Endpoint) bool {
			return e.TargetRef != nil && e.TargetRef.Name == pod
		})
		out, err := yaml.Marshal(&slice)
		if err != nil {
			return err
		}
		docs[i] = out
	}
	tmp := filepath.Join(filepath.Dir(path), ".web.yaml.tmp")
	if err := os.WriteFile(tmp, bytes.Join(docs, []byte("\n---\n")), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
