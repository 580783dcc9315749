package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

// Steady RSS: after the changes, weir run's RSS is sampled every
// rssEvery until it moved by less than rssStill over rssWindow (the Go
// runtime returns freed memory to the kernel gradually), or for rssMost.
const (
	rssEvery  = 500 * time.Millisecond
	rssWindow = 5 * time.Second
	rssStill  = 1 << 10 // KiB
	rssMost   = time.Minute
)

// writeCluster writes the shape's manifests into dir.
func writeCluster(ctx context.Context, dir string, s shape) error {
	if err := scale.WriteAll(dir, s.services, s.endpoints); err != nil {
		return err
	}
	return capped(ctx)
}

// capped returns errCapped once ctx's deadline passed.
func capped(ctx context.Context) error {
	if ctx.Err() != nil {
		return errCapped
	}
	return nil
}

func newNamespace(s shape) (string, error) {
	ns := fmt.Sprintf("weir-bench-%d-%dx%d", os.Getpid(), s.services, s.endpoints)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add: %w: %s", err, out)
	}
	return ns, nil
}

func deleteNamespace(ns string) {
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: ip netns delete %s: %v: %s", ns, err, out)
	}
}

// weirArgs runs weir in ns, with the config file cfg unless it is empty.
func weirArgs(ns, cfg string, args ...string) []string {
	out := append([]string{"netns", "exec", ns, "env", "-u", "WEIR_CONFIG"}, args...)
	if cfg != "" {
		out = append(out, "--config", cfg)
	}
	return out
}

// syncOnce times weir sync --once: the process's wall time and peak RSS,
// and the full sync inside it (from its "Synced rules" log record).
func syncOnce(ctx context.Context, weir, ns, dir, cfg string) (result, error) {
	cmd := exec.CommandContext(ctx, "ip", weirArgs(ns, cfg, weir, "sync", "--once", "--source-path", dir,
		"--node-name", "node-0", "--log-format", "json")...)
	var log strings.Builder
	cmd.Stderr = &log
	start := time.Now()
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return result{}, errCapped
		}
		return result{}, fmt.Errorf("weir sync --once: %w\n%s", err, log.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	r := result{once: time.Since(start), onceRSS: ru.Maxrss,
		onceCPU: time.Duration(ru.Utime.Nano()), onceSys: time.Duration(ru.Stime.Nano())}
	for _, line := range strings.Split(log.String(), "\n") {
		var rec struct {
			Msg, Level      string
			Duration, Hooks time.Duration // slog's JSON handler writes nanoseconds
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch {
		case rec.Msg == "Synced rules":
			r.onceSync, r.onceHooks = rec.Duration, rec.Hooks
		case rec.Level == "WARN" || rec.Level == "ERROR":
			fmt.Fprintln(os.Stderr, line)
		}
	}
	return r, nil
}

// runWeir starts weir run, waits for its first sync, then rewrites one
// EndpointSlice at a time and measures until the "Synced rules" log line;
// then it reads the process's peak and, once it settled, its RSS.
func runWeir(ctx context.Context, weir, ns, dir string, s shape, changes int, cfg string, r *result) error {
	cmd := exec.CommandContext(ctx, "ip", weirArgs(ns, cfg, weir, "run", "--source-path", dir, "--node-name", "node-0",
		"--min-sync-period", "0s", "--log-format", "json")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fails only when weir has exited already
		_ = cmd.Wait()                          // weir's exit status says nothing of the figures
	}()
	synced := syncedLines(stderr)
	if err := waitSynced(ctx, synced); err != nil {
		return fmt.Errorf("first sync: %w", err)
	}
	var times []time.Duration
	for i := range changes {
		svc := (i * 7919) % s.services
		start := time.Now()
		if err := scale.Write(dir, svc, s.endpoints, i+1); err != nil {
			return err
		}
		if err := waitSynced(ctx, synced); err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	// ip netns exec replaces itself with weir, so the pid is weir's.
	pid := cmd.Process.Pid
	r.change, r.runPeak = times[len(times)/2], procStatus(pid, "VmHWM")
	r.runSteady, err = steadyRSS(ctx, pid)
	return err
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

// waitSynced waits for the next "Synced rules" record until ctx's
// deadline.
func waitSynced(ctx context.Context, ch <-chan struct{}) error {
	select {
	case _, ok := <-ch:
		if !ok {
			return errors.New("weir run exited")
		}
		return nil
	case <-ctx.Done():
		return errCapped
	}
}

// steadyRSS samples the process's RSS until it settles (see rssEvery),
// and returns the last sample.
func steadyRSS(ctx context.Context, pid int) (int64, error) {
	tick := time.NewTicker(rssEvery)
	defer tick.Stop()
	samples := []int64{procStatus(pid, "VmRSS")}
	window := int(rssWindow / rssEvery)
	for start := time.Now(); time.Since(start) < rssMost; {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, errCapped
		}
		samples = append(samples, procStatus(pid, "VmRSS"))
		if n := len(samples); n > window && absDiff(samples[n-1], samples[n-1-window]) < rssStill {
			break
		}
	}
	return samples[len(samples)-1], nil
}

func absDiff(a, b int64) int64 { return max(a-b, b-a) }

// procStatus returns a field of /proc/PID/status in KiB; 0 when it
// cannot be read.
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}
