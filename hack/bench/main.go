// Command bench measures Weir at scale with real processes and a real
// kernel: it generates N services × M endpoints as manifests, runs
// `weir sync --once` in a fresh network namespace (wall time, peak RSS), then
// runs `weir run` and times one EndpointSlice file change until its
// transaction is committed. With --plugins it measures the same work again
// through three example hook plugins. It needs root.
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
	"path/filepath"
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
	plugins := flag.String("plugins", "", "folder of the example plugins' .wasm files; adds rows through three plugins")
	iptables := flag.String("iptables", "", "comma-separated iptables flavours (legacy, nft); adds rows in mode iptables")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (creates network namespaces)")
		os.Exit(2)
	}
	vs, err := variants(*plugins, *iptables)
	if err != nil {
		fatal(err)
	}
	defer func() {
		for _, v := range vs {
			for _, path := range []string{v.config, v.cacheDir} {
				if path != "" {
					os.RemoveAll(path)
				}
			}
		}
	}()
	fmt.Printf("| services × endpoints | mode | sync --once wall | its full sync (plugins' part) | sync --once peak RSS | one change → committed (median of %d) | weir run RSS after changes |\n", *changes)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fatal(fmt.Errorf("bad --services value %q", s))
		}
		for _, v := range vs {
			r, err := measure(*weir, n, *endpoints, *changes, v)
			if err != nil {
				fatal(fmt.Errorf("%s: %w", v.label, err))
			}
			fmt.Printf("| %d × %d | %s | %s | %s (%s) | %d MB | %s | %d MB |\n", n, *endpoints, v.label, r.once.Round(time.Millisecond),
				r.onceSync.Round(time.Millisecond), r.onceHooks.Round(time.Millisecond), r.onceRSS>>10,
				r.change.Round(100*time.Microsecond), r.runRSS>>10)
		}
	}
}

// variant is one way of running Weir the benchmark measures.
type variant struct {
	label string
	// config is the config file Weir runs with ("" for the defaults).
	config string
	// cacheDir is the plugins' compilation cache ("" without plugins),
	// warmed by an untimed sync --once before the timed one.
	cacheDir string
}

// variants returns the default nftables mode, then the same through three
// plugins from pluginDir (if set), then mode iptables with each flavour
// listed in flavours; config files are written to temporary files.
func variants(pluginDir, flavours string) ([]variant, error) {
	vs := []variant{{label: "nftables"}}
	if pluginDir != "" {
		cfg, cache, err := pluginConfig(pluginDir)
		if err != nil {
			return vs, err
		}
		vs = append(vs, variant{"nftables + 3 plugins", cfg, cache})
	}
	for _, fl := range strings.Split(flavours, ",") {
		if fl = strings.TrimSpace(fl); fl == "" {
			continue
		}
		cfg, err := writeConfig("mode: iptables\niptables:\n  backend: " + fl + "\n")
		if err != nil {
			return vs, err
		}
		vs = append(vs, variant{label: "iptables-" + fl, config: cfg})
	}
	return vs, nil
}

// pluginConfig writes a Weir config running drain (which takes node-2's
// endpoints out of every service: every service changes), zone-preference
// and affinity (which find nothing to change) from dir. It returns its path
// and the compilation cache folder it names.
func pluginConfig(dir string) (cfg, cache string, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	if cache, err = os.MkdirTemp("", "weir-bench-cache-"); err != nil {
		return "", "", err
	}
	cfg, err = writeConfig(fmt.Sprintf(`hooks:
  cacheDir: %s
plugins:
  - name: drain
    path: %s/drain.wasm
    config: {nodes: [node-2]}
  - name: zone-preference
    path: %s/zone-preference.wasm
  - name: affinity
    path: %s/affinity.wasm
`, cache, abs, abs, abs))
	return cfg, cache, err
}

// writeConfig writes a Weir config file and returns its path.
func writeConfig(text string) (string, error) {
	f, err := os.CreateTemp("", "weir-bench-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.WriteString(text)
	return f.Name(), err
}

type result struct {
	once      time.Duration
	onceSync  time.Duration // the full sync inside sync --once
	onceHooks time.Duration // the hook plugins' part of it
	onceRSS   int64         // KiB
	change    time.Duration
	runRSS    int64 // KiB
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// measure runs variant v on n services × eps endpoints in a fresh
// namespace: the first sync is into empty tables unless v warms a plugin
// cache first; weir run then takes the rules over and times the changes.
func measure(weir string, n, eps, changes int, v variant) (result, error) {
	cfg := v.config
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
		return result{}, fmt.Errorf("ip netns add: %w: %s", err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: ip netns delete %s: %v: %s", ns, err, out)
		}
	}()
	var r result
	if v.cacheDir != "" {
		// Compile the plugins into the cache first: the figures are for a
		// (re)start with a warm cache, as on a node that ran Weir before.
		if _, _, _, _, err := syncOnce(weir, ns, dir, cfg); err != nil {
			return r, err
		}
	}
	if r.once, r.onceSync, r.onceHooks, r.onceRSS, err = syncOnce(weir, ns, dir, cfg); err != nil {
		return r, err
	}
	r.change, r.runRSS, err = timeChanges(weir, ns, dir, n, eps, changes, cfg)
	return r, err
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
func syncOnce(weir, ns, dir, cfg string) (wall, sync, hooks time.Duration, rss int64, err error) {
	cmd := exec.Command("ip", weirArgs(ns, cfg, weir, "sync", "--once", "--source-path", dir,
		"--node-name", "node-0", "--log-format", "json")...)
	var log strings.Builder
	cmd.Stderr = &log
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, 0, fmt.Errorf("weir sync --once: %w\n%s", err, log.String())
	}
	wall = time.Since(start)
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
			sync, hooks = rec.Duration, rec.Hooks
		case rec.Level == "WARN" || rec.Level == "ERROR":
			fmt.Fprintln(os.Stderr, line)
		}
	}
	return wall, sync, hooks, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss, err
}

// timeChanges starts weir run, waits for its first sync, then rewrites one
// EndpointSlice at a time and measures until the "Synced rules" log line.
func timeChanges(weir, ns, dir string, n, eps, changes int, cfg string) (time.Duration, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", weirArgs(ns, cfg, weir, "run", "--source-path", dir, "--node-name", "node-0",
		"--min-sync-period", "0s", "--log-format", "json")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fails only when weir has exited already
		_ = cmd.Wait()                          // weir's exit status says nothing of the figures
	}()
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
