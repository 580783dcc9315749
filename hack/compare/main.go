// Command compare runs kube-proxy and Weir side by side against one real
// control plane (test/compare) and prints a markdown table of both with
// ratios, also written to --out. It needs root, the control plane and
// kube-proxy (make controlplane) and the weir binary (make build):
//
//	go run ./hack/compare --weir bin/weir --sizes 1000x10,10000x10 --modes nftables
//
// It exits 1 when a run failed (a run that passed the cap did not fail)
// and 2 when the comparison could not run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/compare"
	"github.com/weirproxy/weir/test/e2e/controlplane"
)

func main() {
	os.Exit(run())
}

// options are the flags that are not a compare.Config field as is.
type options struct {
	sizes, zeroSizes, proxies, modes string
	out                              string
}

func run() int {
	cfg, opts := compare.Defaults(), options{}
	flag.StringVar(&cfg.Weir, "weir", "bin/weir", "the weir binary")
	flag.StringVar(&cfg.KubeProxy, "kube-proxy", "", "the kube-proxy binary (default: the one make controlplane built)")
	flag.StringVar(&opts.sizes, "sizes", "1000x10,10000x10,5000x50,30000x10", "comma-separated SERVICESxENDPOINTS")
	flag.StringVar(&opts.zeroSizes, "zero-sizes", "10000x10", "sizes at which every proxy runs once more with minSyncPeriod 0 (sizes not in --sizes are left out with a warning; empty: none)")
	flag.StringVar(&opts.proxies, "proxies", "kube-proxy,weir", "comma-separated proxies: kube-proxy, weir")
	flag.StringVar(&opts.modes, "modes", strings.Join(compare.Modes, ","), "comma-separated modes: "+strings.Join(compare.Modes, ", ")+" (ipvs: Weir only, where the kernel has IPVS)")
	flag.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", cfg.MinSyncPeriod, "both proxies' minSyncPeriod")
	flag.DurationVar(&cfg.SyncPeriod, "sync-period", cfg.SyncPeriod, "both proxies' syncPeriod")
	flag.IntVar(&cfg.Changes, "changes", cfg.Changes, "one-endpoint changes timed one at a time")
	flag.Float64Var(&cfg.ChurnRate, "churn-rate", cfg.ChurnRate, "EndpointSlice updates per second in the churn phase")
	flag.DurationVar(&cfg.ChurnDuration, "churn-duration", cfg.ChurnDuration, "how long the churn phase writes")
	flag.IntVar(&cfg.ProbeServices, "probe-services", cfg.ProbeServices, "services with a real pod endpoint, flipped to time changes into the kernel")
	flag.DurationVar(&cfg.Cap, "cap", cfg.Cap, "the longest one run (one proxy, mode, size and setting) may take before it is killed and reported as > cap")
	flag.IntVar(&cfg.Writers, "writers", cfg.Writers, "parallel API writers loading the objects")
	flag.StringVar(&cfg.Dir, "dir", "", "folder for each run's logs (default: a new folder under bin/compare)")
	flag.StringVar(&opts.out, "out", "bin/compare/compare.md", "the markdown file the table is written to")
	flag.Parse()
	if err := configure(&cfg, opts); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return compareAll(ctx, cfg, opts)
}

// configure turns the flags into cfg and checks what the comparison needs.
func configure(cfg *compare.Config, opts options) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	var errs []error
	var err error
	if cfg.Sizes, err = compare.ParseSizes(opts.sizes); err != nil {
		errs = append(errs, fmt.Errorf("--sizes: %w", err))
	}
	if cfg.ZeroSizes, err = compare.ParseSizes(opts.zeroSizes); err != nil {
		errs = append(errs, fmt.Errorf("--zero-sizes: %w", err))
	}
	if cfg.Proxies, err = compare.ParseList(opts.proxies, "proxy", []string{compare.KubeProxy, compare.Weir}); err != nil {
		errs = append(errs, fmt.Errorf("--proxies: %w", err))
	}
	if cfg.Modes, err = compare.ParseList(opts.modes, "mode", compare.Modes); err != nil {
		errs = append(errs, fmt.Errorf("--modes: %w", err))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	cfg.ZeroSizes = slices.DeleteFunc(cfg.ZeroSizes, func(s compare.Size) bool {
		if slices.Contains(cfg.Sizes, s) {
			return false
		}
		fmt.Fprintf(os.Stderr, "compare: --zero-sizes %s is not one of --sizes: no minSyncPeriod 0 run there\n", s)
		return true
	})
	if err := binaries(cfg); err != nil {
		return err
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join("bin", "compare", time.Now().Format("20060102-150405"))
	}
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates network namespaces and runs both proxies in them")
	}
	return nil
}

// binaries finds kube-proxy when not given and makes both paths absolute
// (the proxies run from their own folders).
func binaries(cfg *compare.Config) error {
	if cfg.KubeProxy == "" && slices.Contains(cfg.Proxies, compare.KubeProxy) {
		bins, err := controlplane.FindBinaries()
		if err != nil {
			return err
		}
		cfg.KubeProxy = bins.KubeProxy
	}
	for _, p := range []*string{&cfg.Weir, &cfg.KubeProxy} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("binary %s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}

// compareAll starts the control plane, runs the comparison and writes the
// table; the exit code says how it went.
func compareAll(ctx context.Context, cfg compare.Config, opts options) int {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		return 2
	}
	cfg.Log = os.Stderr
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "compare: "+format+"\n", args...) }
	cpDir := filepath.Join(cfg.Dir, "controlplane")
	cp, stopCP, err := compare.StartControlPlane(cpDir, logf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare: control plane:", err)
		return 2
	}
	header := describe(cfg)
	rep, err := compare.Run(ctx, cp, cfg)
	stopCP()
	if rmErr := os.RemoveAll(cpDir); rmErr != nil {
		logf("removing %s: %v", cpDir, rmErr)
	}
	code := 0
	if rep != nil {
		code = write(rep.Markdown(header, cfg.Cap), opts.out)
		for _, r := range rep.Results {
			if r.Failed != "" {
				code = max(code, 1)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		return 2
	}
	return code
}

// write prints the table and writes it to out.
func write(table, out string) int {
	fmt.Print(table)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		return 2
	}
	if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "compare: table written to %s; logs in %s\n", out, filepath.Dir(out))
	return 0
}

// describe is the line above the table: date, machine, kernel, commit,
// the proxies' versions and the command.
func describe(cfg compare.Config) string {
	cpu := firstMatch("/proc/cpuinfo", "model name")
	mem := "unknown"
	if kb, err := strconv.ParseFloat(strings.TrimSuffix(firstMatch("/proc/meminfo", "MemTotal"), " kB"), 64); err == nil {
		mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("Measured on %s: %d cores (%s), %s of memory, Linux %s, %s; commit %s; kube-proxy %s, Weir %s. Command: `%s`.",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)),
		runtime.Version(), output("git", "describe", "--always", "--dirty"),
		version(cfg.KubeProxy, "--version"), version(cfg.Weir, "version"),
		"hack/compare "+strings.Join(os.Args[1:], " "))
}

// firstMatch is the value of the first "key : value" line of a /proc file.
func firstMatch(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "unknown"
}

// version is the last word bin prints with arg ("Kubernetes v1.37.2",
// "weir dev").
func version(bin, arg string) string {
	if bin == "" {
		return "(not run)"
	}
	f := strings.Fields(output(bin, arg))
	if len(f) == 0 {
		return "unknown"
	}
	return f[len(f)-1]
}

// output is a command's first line of output, or "unknown".
func output(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
