// Command difftest runs Weir's differential test against kube-proxy
// (test/difftest) over a range of seeds and modes on one real control
// plane, prints every disagreement with the objects behind it, and a
// table of the figures, also written to --out. It needs root, the control
// plane and kube-proxy (make controlplane) and the weir binary (make
// build):
//
//	go run ./hack/difftest --weir bin/weir --seeds 1-20 --modes nftables,iptables
//
// It exits 1 when Weir disagreed with kube-proxy, or kube-proxy with
// itself, on any probe, and 2 when the comparison could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/difftest"
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/programt"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg := difftest.Config{}
	var seeds, modes, out string
	flag.StringVar(&cfg.Weir, "weir", "bin/weir", "the weir binary")
	flag.StringVar(&cfg.KubeProxy, "kube-proxy", "", "the kube-proxy binary (default: the one make controlplane built)")
	flag.StringVar(&seeds, "seeds", "1-20", "seeds: comma-separated numbers and FIRST-LAST ranges")
	flag.StringVar(&modes, "modes", strings.Join(difftest.Modes, ","), "comma-separated modes: "+strings.Join(difftest.Modes, ", "))
	flag.IntVar(&cfg.Parallel, "parallel", 12, "probes run at once")
	flag.StringVar(&cfg.Dir, "dir", "", "folder for the proxies' logs (default: a new folder under bin/difftest)")
	flag.StringVar(&out, "out", "bin/difftest/report.md", "the file the report is written to")
	flag.Parse()
	list, err := parseSeeds(seeds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "difftest: --seeds:", err)
		return 2
	}
	ms, err := parseModes(modes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "difftest: --modes:", err)
		return 2
	}
	if err := configure(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "difftest:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runAll(ctx, cfg, list, ms, out)
}

// configure fills in the defaults and checks the binaries.
func configure(cfg *difftest.Config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: it creates network namespaces")
	}
	if cfg.KubeProxy == "" {
		bins, err := controlplane.FindBinaries()
		if err != nil {
			return err
		}
		cfg.KubeProxy = bins.KubeProxy
	}
	for _, b := range []string{cfg.Weir, cfg.KubeProxy} {
		if _, err := os.Stat(b); err != nil {
			return err
		}
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join("bin", "difftest", time.Now().Format("20060102-150405"))
	}
	cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	return os.MkdirAll(cfg.Dir, 0o755)
}

// runAll runs every seed in every mode, prints each result and the table,
// and returns the exit code.
func runAll(ctx context.Context, cfg difftest.Config, seeds []int64, modes []string, out string) int {
	t := programt.New("difftest", cfg.Dir, cfg.Logf)
	defer t.Close()
	var cp *controlplane.ControlPlane
	if err := programt.Catch(func() { cp = controlplane.Start(t) }); err != nil {
		fmt.Fprintln(os.Stderr, "difftest: control plane:", err)
		return 2
	}
	var results []*difftest.Result
	begin := time.Now()
	code := 0
	for _, seed := range seeds {
		res, err := difftest.RunSeed(ctx, cp, cfg, seed, modes)
		for _, r := range res {
			fmt.Println(r.Report())
			if !r.Agrees() {
				code = 1
			}
		}
		results = append(results, res...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "difftest:", err)
			code = 2
			break
		}
	}
	table := difftest.Table(results, fmt.Sprintf("go run ./hack/difftest --seeds %s --modes %s",
		flag.Lookup("seeds").Value, strings.Join(modes, ",")), time.Since(begin))
	fmt.Println(table)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err == nil {
		err = os.WriteFile(out, []byte(table), 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "difftest:", err)
		}
	}
	return code
}

// parseSeeds reads "1-20" or "3,7,9-11".
func parseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		first, last, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: not a seed or range", part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(last, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("%q: not a range FIRST-LAST", part)
			}
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}

// parseModes checks a comma-separated list of modes.
func parseModes(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(difftest.Modes, m) {
			return nil, fmt.Errorf("%q: want %s", m, strings.Join(difftest.Modes, " or "))
		}
		out = append(out, m)
	}
	return out, nil
}
