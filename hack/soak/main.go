// Command soak runs Weir's soak test (test/soak) in one or more modes, one
// after another, prints each report and writes it to a file; it exits 1
// when a target was missed and 2 when the soak could not run. It needs
// root, the test control plane (make controlplane) and the weir binary and
// example plugins (make build plugins):
//
//	go run ./hack/soak --weir bin/weir --plugins bin/plugins --mode nftables,iptables --duration 10m
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/soak"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		cfg     soak.Config
		modes   string
		seed    string
		reports string
	)
	flag.StringVar(&modes, "mode", "nftables", "comma-separated modes: nftables, iptables (iptables.backend auto), iptables-nft, iptables-legacy, ipvs")
	flag.StringVar(&cfg.Source, "source", "kubernetes", "Weir's source: kubernetes (the real control plane) or files (a folder of manifests)")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long each mode churns")
	flag.StringVar(&seed, "seed", "", "seed of every random choice (empty: a new one, printed)")
	flag.IntVar(&cfg.Services, "services", 1000, "churned services at the start")
	flag.IntVar(&cfg.Pods, "pods", 12, "pod namespaces")
	flag.Float64Var(&cfg.Rate, "rate", 4, "churn operations per second")
	flag.DurationVar(&cfg.Round, "round", 20*time.Second, "mean churn time between quiescent points")
	flag.DurationVar(&cfg.SyncPeriod, "sync-period", 5*time.Second, "Weir's syncPeriod")
	flag.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", time.Second, "Weir's minSyncPeriod")
	flag.DurationVar(&cfg.LockHold, "lock-hold", time.Minute, "how long the xtables lock is held")
	flag.StringVar(&cfg.Weir, "weir", "bin/weir", "the weir binary")
	flag.StringVar(&cfg.Plugins, "plugins", "bin/plugins", "the folder of the built example plugins")
	flag.BoolVar(&cfg.NoPlugins, "no-plugins", false, "run Weir without hook plugins, and so without the plugin faults")
	flag.StringVar(&cfg.Guests, "guests", "", "folder of the prebuilt test guests benign.wasm and hostile.wasm (empty: build them)")
	flag.StringVar(&reports, "reports", "bin/soak", "folder for the reports and, when a run fails, its logs")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep each run's folder (logs) even when it passed")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "soak: unexpected argument %q\n", flag.Arg(0))
		return 2
	}
	if seed != "" {
		if _, err := fmt.Sscan(seed, &cfg.Seed); err != nil || cfg.Seed == 0 {
			fmt.Fprintf(os.Stderr, "soak: --seed %q: want a positive integer\n", seed)
			return 2
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "soak: needs root: creates network namespaces and programs their kernel state")
		return 2
	}
	repo, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	cfg.Repo = repo
	for _, p := range []*string{&cfg.Weir, &cfg.Plugins, &reports, &cfg.Guests} {
		if *p == "" {
			continue
		}
		if *p, err = filepath.Abs(*p); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
	}
	if err := os.MkdirAll(reports, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := 0
	for _, mode := range strings.Split(modes, ",") {
		c := cfg
		c.Mode = strings.TrimSpace(mode)
		if c.Seed == 0 {
			c.Seed = uint64(time.Now().UnixNano())>>1 | 1
		}
		c.Dir = filepath.Join(reports, fmt.Sprintf("%s-%d", c.Mode, c.Seed))
		c.Log = os.Stdout
		code = max(code, runMode(ctx, c, reports))
	}
	return code
}

// runMode runs one soak and writes its report; the exit code says how it
// went.
func runMode(ctx context.Context, cfg soak.Config, reports string) int {
	rep, err := soak.Run(ctx, cfg)
	if rep != nil {
		fmt.Print("\n" + rep.Text)
		name := filepath.Join(reports, fmt.Sprintf("soak-%s-%d.txt", cfg.Mode, cfg.Seed))
		if werr := os.WriteFile(name, []byte(rep.Text), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "soak:", werr)
		} else {
			fmt.Printf("report written to %s\n", name)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: mode %s, seed %d: could not run: %v (logs in %s)\n", cfg.Mode, cfg.Seed, err, cfg.Dir)
		return 2
	}
	if len(rep.Failures) > 0 {
		return 1
	}
	return 0
}
