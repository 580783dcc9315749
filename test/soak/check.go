package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// verifyResult is the JSON report of `weir verify -o json`.
type verifyResult struct {
	Mode         string   `json:"mode"`
	Services     int      `json:"services"`
	Destinations int      `json:"destinations"`
	Kept         []string `json:"kept"`
	Divergences  []struct {
		Service     string `json:"service"`
		Destination string `json:"destination"`
		Field       string `json:"field"`
		Message     string `json:"message"`
	} `json:"divergences"`
}

// verifier runs `weir verify` in the node with the daemon's configuration.
type verifier struct {
	bin, config string
	cacheDir    string // its own plugin compilation cache
	node        *netns.Namespace
	env         []string
	runs        int
	took        []time.Duration
}

// run runs weir verify once. An error means it could not compare; a
// result with divergences is not an error.
func (v *verifier) run(ctx context.Context) (*verifyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := v.node.Command(ctx, v.bin, "verify", "--config", v.config, "--hooks-cache-dir", v.cacheDir,
		"--timeout", "60s", "-o", "json", "--log-level", "warn")
	cmd.Env = v.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	begin := time.Now()
	err := cmd.Run()
	v.runs++
	v.took = append(v.took, time.Since(begin))
	var res verifyResult
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil || res.Mode == "" {
		if err == nil {
			err = fmt.Errorf("no report: %w", jerr)
		}
		return nil, fmt.Errorf("weir verify: %w: %s", err, lastLines(errOut.String(), 5))
	}
	var exit *exec.ExitError
	if err != nil && (!errors.As(err, &exit) || len(res.Divergences) == 0) {
		return nil, fmt.Errorf("weir verify: %w: %s", err, lastLines(errOut.String(), 5))
	}
	return &res, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// convergence is the outcome of waiting for the kernel to match the plan.
type convergence struct {
	clean bool
	// took is from the reference time to the end of the last sync before
	// the clean verify (0 when no sync was needed).
	took time.Duration
	// firstSync is the time from the reference to the end of the first
	// successful sync after it, when the metrics show one.
	firstSync time.Duration
	last      *verifyResult // the last verify's report
	err       error         // the last verify's error, if it could not run
	verifies  int
	waited    time.Duration
}

// converge waits until the daemon is quiet (every queued change synced,
// nothing written for a moment) and weir verify finds no divergence,
// until deadline. since is the reference of the times it reports;
// lastWrite the soak's last API write.
func (s *run) converge(ctx context.Context, since, lastWrite time.Time, limit time.Duration) convergence {
	begin := time.Now()
	deadline := begin.Add(limit)
	var c convergence
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, quiet := s.quiet(ctx, lastWrite, deadline)
		if !quiet {
			if !s.d.running() {
				c.err = errExited
			}
			break
		}
		synced := m.timestamp(mLastSync)
		if c.firstSync == 0 && synced.After(since) {
			c.firstSync = synced.Sub(since)
		}
		res, err := s.verify.run(ctx)
		c.verifies++
		c.last, c.err = res, err
		if err == nil && len(res.Divergences) == 0 {
			c.clean = true
			if synced.After(since) {
				c.took = synced.Sub(since)
			}
			break
		}
		if !pause(ctx, 250*time.Millisecond) {
			break
		}
	}
	c.waited = time.Since(begin)
	return c
}

// quiet polls the metrics until every queued change has been synced and
// the soak's last write had time to arrive, until deadline.
func (s *run) quiet(ctx context.Context, lastWrite, deadline time.Time) (metrics, bool) {
	for time.Now().Before(deadline) && s.d.running() {
		m, err := s.d.scrape(ctx)
		if err == nil && m[mPendingSvc] == 0 && m[mPendingEP] == 0 {
			synced, queued := m.timestamp(mLastSync), m.timestamp(mLastQueued)
			arrived := !queued.Before(lastWrite) || time.Since(lastWrite) > 2*time.Second
			if !synced.IsZero() && !synced.Before(queued) && arrived {
				return m, true
			}
		}
		if !pause(ctx, 100*time.Millisecond) {
			return nil, false
		}
	}
	return nil, false
}

// pause waits d or until ctx is done; it reports whether ctx is still live.
// It paces polling loops, which always have a deadline of their own.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
