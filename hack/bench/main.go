// Command bench measures Weir at scale with real processes and a real
// kernel: for each size it generates N services × M endpoints as manifests
// (test/scale), runs `weir sync --once` in a fresh network namespace (wall
// time, peak RSS), then runs `weir run`, times one EndpointSlice file
// change at a time until its transaction is committed, and reads the
// process's peak and steady RSS. With --plugins it measures the same work
// again through three example hook plugins, with --iptables in mode
// iptables. Each size and mode has --cap to finish in: past it the process
// is stopped, what was not measured is reported as "> cap", and the next
// runs. It needs root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	weir := flag.String("weir", "bin/weir", "path to the weir binary")
	sizes := flag.String("services", "1000,10000", "comma-separated sizes: N services (of --endpoints endpoints each) or NxM")
	endpoints := flag.Int("endpoints", 10, "endpoints per service where a size does not say")
	changes := flag.Int("changes", 7, "one-endpoint changes to time in weir run")
	plugins := flag.String("plugins", "", "folder of the example plugins' .wasm files; adds rows through three plugins")
	iptables := flag.String("iptables", "", "comma-separated iptables flavours (legacy, nft); adds rows in mode iptables")
	limit := flag.Duration("cap", 10*time.Minute, "time each size and mode has to finish in")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (creates network namespaces)")
		os.Exit(2)
	}
	shapes, err := parseSizes(*sizes, *endpoints)
	if err != nil {
		fatal(err)
	}
	vs, err := variants(*plugins, *iptables)
	defer removeVariants(vs)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("| services × endpoints | mode | sync --once wall | its CPU, user + system | its full sync (plugins' part) "+
		"| sync --once peak RSS | one change → committed (median of %d) | weir run peak RSS | weir run steady RSS |\n", *changes)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, s := range shapes {
		for _, v := range vs {
			r, err := measure(*weir, s, *changes, v, *limit)
			if err != nil && !errors.Is(err, errCapped) {
				fatal(fmt.Errorf("%d × %d, %s: %w", s.services, s.endpoints, v.label, err))
			}
			fmt.Println(r.row(s, v, *limit))
		}
	}
}

// shape is a cluster size: services × endpoints each.
type shape struct{ services, endpoints int }

// parseSizes parses --services: N (with eps endpoints) or NxM entries.
func parseSizes(list string, eps int) ([]shape, error) {
	var out []shape
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		n, m, wide := strings.Cut(item, "x")
		s := shape{endpoints: eps}
		var err error
		if s.services, err = strconv.Atoi(n); err == nil && wide {
			s.endpoints, err = strconv.Atoi(m)
		}
		if err != nil || s.services < 1 || s.endpoints < 1 {
			return nil, fmt.Errorf("bad --services value %q: want N or NxM", item)
		}
		out = append(out, s)
	}
	return out, nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// errCapped says that a measurement ran past its cap.
var errCapped = errors.New("past the cap")

// result is what one size and mode measured; zero durations and sizes
// were not (the cap came first).
type result struct {
	once      time.Duration
	onceSync  time.Duration // the full sync inside sync --once
	onceHooks time.Duration // the hook plugins' part of it
	onceRSS   int64         // KiB
	// onceCPU and onceSys are its user and system CPU time: on a shared
	// machine they vary less than its wall time.
	onceCPU, onceSys time.Duration
	change           time.Duration
	runPeak          int64 // KiB
	runSteady        int64 // KiB
}

// row renders the result as a table row; "> cap" stands for what the cap
// cut short.
func (r result) row(s shape, v variant, limit time.Duration) string {
	capped := "> " + limit.String()
	dur := func(d, round time.Duration) string {
		if d == 0 {
			return capped
		}
		return d.Round(round).String()
	}
	mb := func(kib int64) string {
		if kib == 0 {
			return capped
		}
		return fmt.Sprintf("%d MiB", kib>>10)
	}
	sync, cpu := capped, capped
	if r.once > 0 {
		sync = fmt.Sprintf("%s (%s)", r.onceSync.Round(time.Millisecond), r.onceHooks.Round(time.Millisecond))
		cpu = fmt.Sprintf("%s + %s", r.onceCPU.Round(10*time.Millisecond), r.onceSys.Round(10*time.Millisecond))
	}
	return fmt.Sprintf("| %d × %d | %s | %s | %s | %s | %s | %s | %s | %s |", s.services, s.endpoints, v.label,
		dur(r.once, time.Millisecond), cpu, sync, mb(r.onceRSS), dur(r.change, 100*time.Microsecond), mb(r.runPeak), mb(r.runSteady))
}

// measure runs variant v on a shape in a fresh namespace within limit:
// the first sync is into empty tables unless v warms a plugin cache
// first; weir run then takes the rules over and times the changes.
func measure(weir string, s shape, changes int, v variant, limit time.Duration) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	dir, err := os.MkdirTemp("", "weir-bench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	if err := writeCluster(ctx, dir, s); err != nil {
		return result{}, err
	}
	ns, err := newNamespace(s)
	if err != nil {
		return result{}, err
	}
	defer deleteNamespace(ns)
	var r result
	if v.cacheDir != "" {
		// Compile the plugins into the cache first: the figures are for a
		// (re)start with a warm cache, as on a node that ran Weir before.
		if _, err := syncOnce(ctx, weir, ns, dir, v.config); err != nil {
			return r, err
		}
	}
	if r, err = syncOnce(ctx, weir, ns, dir, v.config); err != nil {
		return r, err
	}
	err = runWeir(ctx, weir, ns, dir, s, changes, v.config, &r)
	return r, err
}
