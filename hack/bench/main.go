// Command bench measures Weir at scale with real processes and a real
// kernel: it generates N services × M endpoints as manifests, runs
// `weir sync --once` in a fresh network namespace (wall time, peak RSS), then
// runs `weir run` and times one EndpointSlice file change until its
// transaction is committed. It needs root.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/scale"
)

func main() {
	weir := flag.String("weir", "bin/weir", "path to the weir binary")
	counts := flag.String("services", "1000,10000", "comma-separated service counts")
	endpoints := flag.Int("endpoints", 10, "endpoints per service")
	changes := flag.Int("changes", 7, "one-endpoint changes to time in weir run")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (creates network namespaces)")
		os.Exit(2)
	}
	fmt.Printf("| services × endpoints | sync --once wall | sync --once peak RSS | one change → committed (median of %d) | weir run RSS after changes |\n", *changes)
	fmt.Println("| --- | --- | --- | --- | --- |")
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fatal(fmt.Errorf("bad --services value %q", s))
		}
		r, err := measure(*weir, n, *endpoints, *changes)
		if err != nil {
			fatal(err)
		}
		fmt.Printf("| %d × %d | %s | %d MB | %s | %d MB |\n", n, *endpoints, r.once.Round(time.Millisecond), r.onceRSS>>10,
			r.change.Round(100*time.Microsecond), r.runRSS>>10)
	}
}

type result struct {
	once    time.Duration
	onceRSS int64 // KiB
	change  time.Duration
	runRSS  int64 // KiB
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func measure(weir string, n, eps, changes int) (result, error) {
	dir, err := os.MkdirTemp("", "weir-bench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	if err := scale.WriteAll(dir, n, eps); err != nil {
		return result{}, err
	}
	ns := fmt.Sprintf("weir-bench-%d-%d", os.Getpid(), n)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return result{}, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "delete", ns).Run()
	var r result
	if r.once, r.onceRSS, err = syncOnce(weir, ns, dir); err != nil {
		return r, err
	}
	r.change, r.runRSS, err = timeChanges(weir, ns, dir, n, eps, changes)
	return r, err
}

func weirArgs(ns string, args ...string) []string {
	return append([]string{"netns", "exec", ns, "env", "-u", "WEIR_CONFIG"}, append([]string{}, args...)...)
}

func syncOnce(weir, ns, dir string) (time.Duration, int64, error) {
	cmd := exec.Command("ip", weirArgs(ns, weir, "sync", "--once", "--source-path", dir,
		"--node-name", "node-0", "--log-level", "warn")...)
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("weir sync --once: %w", err)
	}
	return time.Since(start), cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss, nil
}

// timeChanges starts weir run, waits for its first sync, then rewrites one
// EndpointSlice at a time and measures until the "Synced rules" log line.
func timeChanges(weir, ns, dir string, n, eps, changes int) (time.Duration, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", weirArgs(ns, weir, "run", "--source-path", dir, "--node-name", "node-0",
		"--min-sync-period", "0s", "--log-format", "json")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	synced := syncedLines(stderr)
	if err := waitSynced(synced, 3*time.Minute); err != nil {
		return 0, 0, fmt.Errorf("first sync: %w", err)
	}
	var times []time.Duration
	for i := range changes {
		svc := (i * 7919) % n
		start := time.Now()
		if err := scale.Write(dir, svc, eps, i+1); err != nil {
			return 0, 0, err
		}
		if err := waitSynced(synced, 30*time.Second); err != nil {
			return 0, 0, fmt.Errorf("change %d: %w", i, err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	return times[len(times)/2], rssKiB(cmd.Process.Pid), nil
}

// syncedLines forwards a signal for every "Synced rules" record and copies
// warnings and errors to our stderr.
func syncedLines(r io.Reader) <-chan struct{} {
	ch := make(chan struct{}, 16)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec struct{ Msg, Level string }
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			if rec.Msg == "Synced rules" {
				ch <- struct{}{}
			} else if rec.Level == "WARN" || rec.Level == "ERROR" {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}
		close(ch)
	}()
	return ch
}

func waitSynced(ch <-chan struct{}, limit time.Duration) error {
	select {
	case _, ok := <-ch:
		if !ok {
			return fmt.Errorf("weir run exited")
		}
		return nil
	case <-time.After(limit):
		return fmt.Errorf("no sync within %s", limit)
	}
}

func rssKiB(pid int) int64 {
	// ip netns exec replaces itself with weir, so pid is weir's.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return v
		}
	}
	return 0
}
